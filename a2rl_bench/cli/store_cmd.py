"""`a2rl store merge`: every host's finished runs into one results store (a2rl_bench.store.merge); `a2rl store
trust-host`: register a host's ledger key, so that its runs verify here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from a2rl_bench.run_options import DEFAULT_RESULTS
from a2rl_bench.paths import HOSTS_PATTERN


def add_store_parsers(sub) -> None:
    store = sub.add_parser("store", help="results stores of several hosts: merge them into one")
    actions = store.add_subparsers(dest="store_action", required=True)
    merge = actions.add_parser(
        "merge", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="merge the finished runs of host stores into one store (idempotent; tampered run directories refused)",
        description="Rebuild the rows of every finished run of each host store in --into from its run directory "
        "(runs/ beside the host's store, else where the host recorded it), verified against the ledger heads the host's "
        "store anchored. Merging twice changes nothing; a torn or tampered run directory is refused (exit 1) and "
        "leaves --into as it was; runs still `running` on their host are left for a later merge.",
    )  # fmt: skip
    merge.add_argument("sources", nargs="*", default=[HOSTS_PATTERN],
                       help="host stores (paths or quoted glob patterns)")
    merge.add_argument("--into", default=str(DEFAULT_RESULTS), help="the central store (created if missing)")
    merge.add_argument("--unverified", action="store_true",
                       help="also take runs whose ledger cannot be verified here (no MAC under a trusted key): each is "
                       "marked UNVERIFIED in every table, CSV and figure, and never replaces a verified run")  # fmt: skip
    trust = actions.add_parser(
        "trust-host", help="register a host's ledger key: its runs' reports then verify in this machine's stores",
        description="Copy a host's ledger key (its A2RL_HOME/ledger.key, brought over a trusted channel) into this "
        "machine's A2RL_HOME/trusted-ledger-keys/ (readable by this user only; never into a results store). "
        "`a2rl store merge` accepts a run only when its report's ledger head carries a MAC under this machine's own "
        "key or a registered one.",
    )  # fmt: skip
    actions.add_parser(
        "host-key", help="print the path of this machine's ledger key (made if missing), for `trust-host` elsewhere",
        description="When a host joins: run this on the host, copy the file it names to the machine that merges "
        "(over a trusted channel: it is a secret), and run `a2rl store trust-host FILE --host NAME` there.",
    )  # fmt: skip
    trust.add_argument("key_file", help="the host's ledger.key")
    trust.add_argument("--host", default="", help="a name for the host (recorded beside the key id)")


def cmd_store(args: argparse.Namespace) -> int:
    from a2rl_bench.ops.prefect_local import server_flow_run_lookup
    from a2rl_bench.store.merge import expand_sources, merge_stores

    if args.store_action == "host-key":
        from a2rl_bench.grading.ledger import own_key_path

        print(own_key_path(create=True))
        return 0
    if args.store_action == "trust-host":
        from a2rl_bench.grading.ledger import trust_host_key

        try:
            key_id = trust_host_key(Path(args.key_file), args.host)
        except (OSError, ValueError) as e:
            print(f"a2rl: {e}", file=sys.stderr)
            return 2
        print(f"trusted ledger key {key_id}{' of ' + args.host if args.host else ''}: its runs verify here")
        return 0

    sources = expand_sources(args.sources, args.into)
    if not sources:
        print(f"a2rl: no host store matches {' '.join(args.sources)} (other than --into {args.into}); copy each "
              "host's results directory first, e.g. to results/hosts/<host>/", file=sys.stderr)  # fmt: skip
        return 2
    print(f"merging {len(sources)} host store(s) into {Path(args.into).resolve()} ...", flush=True)
    report = merge_stores(args.into, sources, unverified=args.unverified, flow_runs=server_flow_run_lookup())
    for o in report.notable():
        print(f"  {o.status:10}  {o.run_id}  ({o.source}){': ' + o.detail if o.detail else ''}")
    print(report.summary())
    if report.refused:
        print(f"a2rl: {len(report.refused)} run(s) refused and not merged (above); the store holds everything "
              "else. Copy their run directories again (or find out who changed them) and merge again", file=sys.stderr)  # fmt: skip
        return 1
    return 0
