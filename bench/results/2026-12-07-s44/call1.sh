#!/usr/bin/env bash
# Session 44's next call, never run (session 45's requests for a machine were all refused): superseded by
# bench/results/2026-12-07-s45/call.sh, which holds its parts (pair, route, train39; the same default PART) with
# the pair's times paired (bench/timing.py), and two parts more (labels, exact39). Carry .tri/1 and .whl.
exec bash "$(dirname "$0")/../2026-12-07-s45/call.sh" "$@"
