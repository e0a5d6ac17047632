"""The grading service: ledger, budget clock, checkpoint checks, the route audit, evaluation queue and HTTP API."""

from a2rl_bench.grading.errors import SubmissionRejected
from a2rl_bench.grading.clock import BudgetClock
from a2rl_bench.grading.ledger import Ledger, LedgerCorrupted
from a2rl_bench.grading.server import GradingServer
from a2rl_bench.grading.service import GradingContext, GradingService

__all__ = [
    "BudgetClock", "GradingContext", "GradingServer", "GradingService", "Ledger", "LedgerCorrupted",
    "SubmissionRejected",
]
