"""The grading service: ledger, budget clock, checkpoint checks, the route audit, evaluation queue and HTTP API."""

from a2rl.grading.errors import SubmissionRejected
from a2rl.grading.clock import BudgetClock
from a2rl.grading.ledger import Ledger, LedgerCorrupted
from a2rl.grading.server import GradingServer
from a2rl.grading.service import GradingContext, GradingService

__all__ = [
    "BudgetClock", "GradingContext", "GradingServer", "GradingService", "Ledger", "LedgerCorrupted",
    "SubmissionRejected",
]
