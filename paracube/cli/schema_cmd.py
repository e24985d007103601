"""`paracube schema [plan|estimate|validate]`: print the JSON Schema of a file paracube writes."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of the plan file, simulate --json or validate --json")
    p.add_argument("which", nargs="?", default="plan", help="plan (default), estimate or validate")
    p.set_defaults(handler=schema_cmd)


def schema_cmd(args: argparse.Namespace) -> int:
    from paracube.cli.options import print_json
    from paracube.schemas import json_schema

    print_json(json_schema(args.which))
    return 0
