# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The preflight's report (tpfix.preflight.doctor) in words: ``text(report)``, lines
of at most WIDTH characters, sizes rounded (``size``), each start's error
said once (``start_errors``); --json prints the report itself."""

from __future__ import annotations

import textwrap

SIMULATED_SHORT = (
    "replayed with the line's real vLLM and FlashInfer checks on a simulated GPU, TP group "
    "and kernels (--json: what exactly)"
)
WIDTH = 100  # the text output's lines
# the report's lines on what the replay did not model, one each
CAVEATS = ("note", "quantized", "standalone", "spec")


def size(mib: float) -> str:
    """A size for people: whole MiB from 10 MiB on, else one decimal
    (80 MiB, 1.1 MiB); --json keeps the exact bytes."""
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.1f} MiB".replace(".0 MiB", " MiB")


def text(report: dict) -> str:
    """The report as the doctor prints it without --json."""
    f = report["facts"]
    out = [
        f"vLLM {report['line']} on {report['gpu']}, Python {report['python']}, "
        f"all-reduce backend {report['allreduce_backend']}",
        f"  target {f['model']} (hidden {f['target_hidden']}), dtype {f['dtype']}, TP {f['tp']}, "
        f"max_num_batched_tokens {f['max_num_batched_tokens']}",
    ]
    if f.get("pp", 1) > 1 or f.get("dp", 1) > 1:  # each stage and replica: its own TP group
        out.append(
            f"  layout: {f['pp']} pipeline stage(s) x {f['dp']} data-parallel replica(s), "
            f"executor {f['executor']}; each has its own TP group of {f['tp']}"
            + (", replayed once for all" if report["verdict"] else "")
        )
    if f["draft_model"]:
        out.append(
            f"  drafter {f['draft_model']} (hidden {f['draft_hidden']}, method {f['spec_method']})"
        )
    if report.get("bug_c"):
        for k in ("stock", "patched"):
            out.append(f"  FlashInfer import ({k}): {report['bug_c'][k] or 'ok'}")
    for key in ("fusion", *CAVEATS):
        if report.get(key):
            out.append("  " + report[key])
    v = report["verdict"]
    for model in v.get("stock", {}).get("models", {}):
        out.append(f"  {model}:")
        for k in ("stock", "patched"):
            m = v[k]["models"][model]
            shown = start_errors(m["result"]) or ["ok"]
            out.append(f"    {k:8s} {shown[0]}")
            out.extend(f"             {more}" for more in shown[1:])
            out.append(
                f"             fused tokens {m['fused_tokens']}; one-shot up to "
                f"{m['oneshot_max_tokens']} tokens, two-shot above"
            )
    for lost in report.get("lost_fusion") or []:
        stock = "no tokens" if lost["stock"] == "none" else f"tokens {lost['stock']}"
        out.append(
            f"  lost fusion: stock fuses {stock} of the {lost['model']}, "
            f"the patched wheel {lost['patched']}"
        )
    for k in v:
        ws, mib = v[k]["workspace"], v[k]["workspace_mib_per_rank"]
        if mib:
            shape = f" ({ws['max_token_num']} x {ws['hidden_dim']})" if "hidden_dim" in ws else ""
            out.append(
                f"  workspace {k}, {v[k]['workspace_start']} start{shape}: "
                f"buffer {size(mib['buffer_mib'])}, Lamport {size(mib['lamport_mib'])} per rank"
            )
        sweep = v[k]["starts"].get("bug_b_sweep")
        if sweep:
            out.append(f"  MNNVL sweep {k}: {sweep.get('failures')} failing token counts")
    if v:  # a replay ran
        out.append("  " + SIMULATED_SHORT)
    out.append(f"advice: {report['advice']}")
    return "\n".join(wrap(line) for line in out)


def start_errors(result: dict | None) -> list[str]:
    """One line per distinct error, each start that ends in it named once:
    "cold start, warm start (at profile:draft:8192): ValueError: ..."."""
    starts: dict[str, list[str]] = {}
    for order, err in (result or {}).items():
        msg, _, at = err.partition(" (at ")
        starts.setdefault(msg, []).append(f"{order} start" + (f" (at {at}" if at else ""))
    return [f"{', '.join(orders)}: {msg}" for msg, orders in starts.items()]


def wrap(line: str) -> str:
    """A line of at most WIDTH characters, continued under its own indent."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(
        line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
