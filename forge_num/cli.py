"""The ``forge-num`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="forge-num", description="forge_num: fused optimizer-in-backward, verified")
    ap.add_argument("command", choices=["verify"], help="verify: run the fused kernel on a built-in case and check it")
    args, rest = ap.parse_known_args(argv)
    if args.command == "verify":
        from forge_num import verify

        return verify.main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
