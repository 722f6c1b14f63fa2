# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Preflight: will this `vllm serve` line crash, and what does our wheel change.

    ./build.sh doctor [--gpu sm90|sm100|sm103] [--allreduce-backend trtllm|mnnvl]
                      [--python 3.10|3.11|3.12] [--line TAG] [--json]
                      -- vllm serve MODEL [vLLM's own options]
    ./build.sh doctor [...] --from deploy.yaml [--container NAME]

No GPU.  The serve line (written after --, or read from a Kubernetes
manifest or compose file with --from: tpfix.preflight.deployment_file) is
parsed by the line's own vLLM
(its serve argument parser, ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config``) in a subprocess against the pristine tree; model
and draft configurations come from a local folder or the local Hugging Face
cache (HF_HUB_OFFLINE=1).  Then the deployment's cold start and warm start
(AOT cache; profile run, then CUDA graph capture largest size first, none
with the resolved cudagraph_mode NONE) run on the pristine and on the
patched tree of the line (tpfix.replay.doctor_scenario,
built on the bug A replay; with MNNVL and two widths also bug B's sweep).
Bug C (FlashInfer's import on Python < 3.12) is decided by reading the
FlashInfer release each tree pins.

Exit code: 0 unaffected, 1 stock vLLM fails and the patched wheel fixes it,
2 the patched wheel fails too, 3 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.specifiers import SpecifierSet

from tpfix.audit.support_matrix import pin_facts
from tpfix.core.lines import get_line, line_names
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail
from tpfix.preflight.deployment_file import serve_line, split_env
from tpfix.preflight.doctor_text import CAVEATS, size, text, wrap
from tpfix.replay.harness import flashinfer_site, interpreter, pinned_flashinfer, run_scenario
from tpfix.stages.patch import cached_tree

GPUS = {"sm90": 90, "sm100": 100, "sm103": 103}
PYTHONS = ("3.10", "3.11", "3.12")
SIMULATED = (
    "simulated (no GPU): the device (CUDA platform, the chosen SM capability, its name "
    "and memory), torch.distributed (a fake TP group), GPU allocation (FlashInfer's real "
    "workspace classes sized by FlashInfer's own formulas, at MNNVL allocation granularity "
    "1), CUDA graph capture (a flag) and the kernels (each launch recorded, no values "
    "computed; bug B's MNNVL sweep: CPU references); real: the line's "
    "vLLM configuration, worker, fusion pass and fused op code and FlashInfer's Python "
    "checks; bug C by reading FlashInfer's source"
)
BUG_C_MESSAGE = "TypeError: type 'array.array' is not subscriptable"
EXIT_OK, EXIT_FIXED, EXIT_STILL, EXIT_BAD = 0, 1, 2, 3
MiB = 1024 * 1024


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad doctor options are bad input: exit 3
        raise Fail(f"doctor: {message}")


def _args(argv: list[str]) -> argparse.Namespace:
    ap = _Parser(prog="build.sh doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="sm90", help="sm90 (default), sm100 or sm103")
    ap.add_argument("--allreduce-backend", choices=("trtllm", "mnnvl"), default=None)
    ap.add_argument("--python", default="3.12", help="the deployment's Python (3.12)")
    ap.add_argument(
        "--line",
        default=None,
        choices=line_names(),
        help=f"release line (default: {line_names()[0]})",
    )
    ap.add_argument(
        "--from",
        dest="from_file",
        type=Path,
        metavar="FILE",
        help="read the serve line and its env from a Kubernetes manifest or a compose file",
    )
    ap.add_argument("--container", help="with --from: the container (or service) to read")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("serve", nargs=argparse.REMAINDER, help="-- vllm serve MODEL ...")
    args = ap.parse_args(argv)
    if args.gpu not in GPUS:
        raise Fail(f"doctor: unknown --gpu {args.gpu!r}; one of {', '.join(GPUS)}")
    if args.python not in PYTHONS:
        raise Fail(f"doctor: unknown --python {args.python!r}; one of {', '.join(PYTHONS)}")
    return args


def serve_argv(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """The options after `vllm serve`, and the VAR=value words before it."""
    if words[:1] == ["--"]:
        words = words[1:]
    env, words = split_env(words)
    if words[:2] != ["vllm", "serve"]:
        raise Fail(
            "doctor: give the serve line after --, as written: "
            "./build.sh doctor -- vllm serve MODEL [options]"
        )
    return words[2:], env


def bug_c(tree: Path, python: str) -> str | None:
    """FlashInfer's import error on `python`, by reading the pinned release:
    a module of flashinfer.comm that evaluates `array.array[...]` at import
    (no postponed annotations) raises TypeError before Python 3.12."""
    if tuple(map(int, python.split("."))) >= (3, 12):
        return None
    comm = flashinfer_site(pinned_flashinfer(tree)) / "flashinfer" / "comm"
    for f in sorted(comm.rglob("*.py")):
        text = f.read_text()
        if re.search(r"array\.array\[", text) and "from __future__ import annotations" not in text:
            return f"{BUG_C_MESSAGE} (flashinfer/comm/{f.relative_to(comm).as_posix()})"
    return None


def _trees(line) -> dict[str, Path]:
    """Pristine and patched trees of the line, and the tree the stock bug A/B
    replays run on: on a host whose Python hits bug C with the pristine
    FlashInfer, the shortest prefix of the series that fixes it (the vLLM
    code of the pristine tree, with the FlashInfer release of that prefix)."""
    trees = {"stock": cached_tree(line, upto=""), "patched": cached_tree(line, upto=None)}
    replay = trees["stock"]
    host = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if bug_c(replay, host):
        for name in read_series(line.series):
            replay = cached_tree(line, upto=name)
            if not bug_c(replay, host):
                break
    trees["stock_replay"] = replay
    return trees


_WIDTH = re.compile(r"hidden_dim \((\d+)\)")


def _attribute(result: dict, facts: dict) -> str | None:
    """Which model's tensor a start's error came from, where it says so."""
    if "error" not in result:
        return None
    at = result.get("at") or ""
    for model in ("draft", "target"):
        if f":{model}:" in at:
            return model
    m = _WIDTH.search(result.get("message", ""))
    if m and facts.get("draft_hidden") == int(m.group(1)) != facts["target_hidden"]:
        return "draft"
    return "target" if m else "engine"


def _error(result: dict) -> str | None:
    if "error" not in result:
        return None
    msg = " ".join(result.get("message", "").split())
    return f"{result['error']}: {msg}" + (f" (at {result['at']})" if result.get("at") else "")


def _ranges(result: dict, model: str) -> str:
    fused = (result.get("fused_ranges") or {}).get(model)
    if not fused:
        return "none"
    return ", ".join(f"{a}-{b}" for a, b in fused)


def _mib(ws: dict | None) -> dict | None:
    if not ws:
        return None
    return {"buffer_mib": ws["buffer_bytes"] / MiB, "lamport_mib": ws["lamport_bytes"] / MiB}


def _summary(run: dict, facts: dict, extra: dict | None) -> dict:
    """One tree's verdict: per start its error; per model what it got."""
    starts = {order: _error(run[order]) for order in ("cold", "warm")}
    if extra is not None:
        starts["bug_b_sweep"] = extra
    models = {}
    for model in ("target", "draft"):
        if model == "draft" and facts.get("draft_hidden") is None:
            continue
        errors = {
            o: starts[o] for o in ("cold", "warm") if _attribute(run[o], facts) in (model, "engine")
        }
        models[model] = {
            "hidden": facts[f"{model}_hidden"],
            "result": errors or None,
            "fused_tokens": _ranges(run["warm"], model),
            "fused_up_to": max(
                (b for _, b in (run["warm"].get("fused_ranges") or {}).get(model) or []),
                default=0,
            ),
            "oneshot_max_tokens": run["warm"].get("oneshot_max_tokens", {}).get(model),
        }
    start = "warm" if run["warm"].get("workspace") else "cold"
    ws = run[start].get("workspace")
    return {
        "workspace_start": start,
        "starts": starts,
        # the warm start's CUDA graph captures (none with cudagraph_mode NONE)
        "capture_sizes": (run["warm"].get("capture_sizes") or {}).get("count"),
        "models": models,
        "workspace": ws,
        "workspace_mib_per_rank": _mib(ws),
        "failed": any(v for k, v in starts.items() if k != "bug_b_sweep")
        or bool(extra and extra.get("failures")),
    }


def _bug_b(tree: Path, facts: dict, capability: int) -> dict | None:
    """bug_b's sweep (every fused token count of each width through the real
    op) when a tensor narrower than the workspace meets MNNVL."""
    widths = [facts["target_hidden"], facts.get("draft_hidden")]
    widths = sorted({w for w in widths if w}, reverse=True)
    if facts["backend"] != "mnnvl" or len(widths) < 2:
        return None
    limit = facts["max_num_batched_tokens"]
    counts = None if limit <= 1024 else sorted({*range(1, 129), *range(128, limit + 1, 64)})
    res = run_scenario(
        tree,
        "bug_b:run_case",
        backend="mnnvl",
        capability=capability,
        tp=facts["tp"],
        widths=widths,
        dtype=facts["dtype"] if facts["dtype"] in ("bfloat16", "float16") else "bfloat16",
        limit=limit,
        token_counts=counts,
    )
    if "error" in res:
        return {"error": _error(res), "failures": 1}
    return {"failures": res["failures"], "examples": res["failure_examples"]}


def _vllm_message(message: str) -> str:
    """The error vLLM gave, on one line, without pydantic's dump of the input."""
    lines = [re.sub(r" \[type=.*$", "", ln).strip() for ln in message.splitlines()]
    text = " ".join(ln for ln in lines if ln and "errors.pydantic.dev" not in ln)
    # pydantic's framing names vLLM's classes, not the operator's input
    text = re.sub(r"^\d+ validation errors? for \w+ ", "", text).replace("Value error, ", "")
    return re.sub(r"\btorch\.(\w+)", r"\1", text)


def diagnose(argv: list[str], progress=lambda s: None) -> tuple[int, dict]:
    """Run the doctor; (exit code, report).  Fail for bad input."""
    # the replay interpreters: killed on leaving (kept, in the tests: keep_interpreters)
    with contextlib.ExitStack() as stack:
        return _diagnose(argv, progress, stack)


def _diagnose(argv: list[str], progress, stack: contextlib.ExitStack) -> tuple[int, dict]:
    t0 = time.monotonic()
    args = _args(argv)
    line = get_line(args.line)
    requires = pin_facts(line)["requires-python"]  # the official wheel's Requires-Python
    if args.python not in SpecifierSet(requires):
        raise Fail(f"doctor: vLLM {line.tag} needs Python {requires}; pass another --python")
    if args.from_file is not None:
        if args.serve not in ([], ["--"]):
            raise Fail("doctor: give either --from FILE or a serve line after --, not both")
        name, words, env = serve_line(args.from_file, args.container)
        step0 = f"{args.from_file}: container {name}: vllm serve {shlex.join(words)}"
        progress(f"doctor: {step0}")
    elif args.container is not None:
        raise Fail("doctor: --container goes with --from FILE")
    else:
        words, env = serve_argv(args.serve)
    capability = GPUS[args.gpu]
    backend = args.allreduce_backend or env.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto")
    if backend not in ("trtllm", "mnnvl"):
        backend = "trtllm"
        assumed = "trtllm (auto-selected on a device without MNNVL multicast; "
        assumed += "pass --allreduce-backend mnnvl where it picks MNNVL)"
    else:
        assumed = backend
    step = lambda s: progress(f"doctor: [{time.monotonic() - t0:5.1f}s] {s}")  # noqa: E731
    step(f"trees of {line.tag} (pristine, patched)")
    trees = _trees(line)
    os.environ["HF_HUB_OFFLINE"] = "1"
    # Both replay interpreters import vLLM at once; the stock one parses the
    # serve line in a fork (the parse sets the deployment's VLLM_* variables
    # and fakes the GPU's name: its replay starts from the imports only).
    ahead = [("doctor_scenario:prepare", {"backend": backend})]
    replays = {
        k: stack.enter_context(interpreter(trees[t], ahead))
        for k, t in (("stock", "stock_replay"), ("patched", "patched"))
    }
    step("parsing the serve line with vLLM's own parser and engine args (pristine tree)")
    facts = replays["stock"].run(
        "doctor_scenario:parse",
        fork=True,
        argv=words,
        capability=capability,
        backend=backend,
        cwd=os.getcwd(),
        env=env,
    )
    if "error" in facts:
        facts.pop("stderr", None)
        message = _vllm_message(facts["message"]).removeprefix("vllm serve: ")
        if facts["error"] in ("BadInput", "ArgumentError"):  # said as is
            raise Fail(f"vllm serve: {message.removeprefix('error: ')}")
        said = "" if facts["error"] in ("ValidationError", "ValueError") else facts["error"] + ": "
        raise Fail(f"vllm serve: {said}{message}")
    facts["backend"] = backend
    report: dict = {
        "line": line.tag,
        "gpu": args.gpu,
        "python": args.python,
        "allreduce_backend": assumed,
        "facts": facts,
        "simulated": SIMULATED,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    if facts["dtype"] not in ("bfloat16", "float16"):
        report["note"] = (
            f"dtype {facts['dtype']}: not replayed as such: the starts use 2-byte (bfloat16) "
            "activations, so sizes and verdicts are those of a 16-bit deployment"
        )
    if facts.get("quantization") and not facts["no_fusion"]:
        report["quantized"] = (
            f"quantization {facts['quantization']}: not replayed: its quantized fused patterns "
            "(get_fi_ar_quant_workspace); the verdict is the unquantized fusion's"
        )
    if facts.get("standalone_allreduce"):
        report["standalone"] = (
            "VLLM_ALLREDUCE_USE_FLASHINFER=1: not replayed: the standalone FlashInfer "
            "all-reduce (outside the fusion pass)"
        )
    if facts["draft_hidden"] and facts["spec_method"] != "draft_model":  # eagle, mtp, ...
        report["spec"] = (
            f"spec method {facts['spec_method']}: not replayed as such: its drafter is replayed "
            "as a draft model of its own width; the proposer's own steps are not"
        )
    stock_c, patched_c = bug_c(trees["stock"], args.python), bug_c(trees["patched"], args.python)
    report["bug_c"] = {"stock": stock_c, "patched": patched_c} if facts["tp"] > 1 else None
    verdict: dict[str, dict] = {}
    if not facts["no_fusion"]:
        kw = {
            k: facts[k]
            for k in (
                "target_hidden",
                "draft_hidden",
                "tp",
                "max_num_batched_tokens",
                "dtype",
                "fusion_max_size_mb",
                "cudagraph_mode",
            )
        }
        kw.update(capability=capability, backend=backend)
        step("cold and warm start, stock and patched (in parallel)")
        with ThreadPoolExecutor(max_workers=4) as pool:
            runs = {
                # in a fork, as the parse: the interpreter stays as it started
                k: pool.submit(replay.run, "doctor_scenario:deployment", fork=True, **kw)
                for k, replay in replays.items()
            }
            extras = {
                k: pool.submit(_bug_b, trees[t], facts, capability)
                for k, t in (("stock", "stock_replay"), ("patched", "patched"))
            }
            for k in runs:
                run = runs[k].result()
                if "error" in run:
                    raise Fail(f"doctor: the {k} replay broke: {_error(run)}")
                verdict[k] = _summary(run, facts, extras[k].result())
    else:
        report["fusion"] = f"no fused all-reduce: {facts['no_fusion']}"
    report["verdict"] = verdict
    report["lost_fusion"] = [
        {"model": m, "stock": s["fused_tokens"], "patched": p["fused_tokens"]}
        for m, s in (verdict.get("stock") or {}).get("models", {}).items()
        if (p := verdict["patched"]["models"][m])["fused_up_to"] > s["fused_up_to"]
        and not s["result"]
    ]
    stock_fails = bool(stock_c) or any(v["failed"] for k, v in verdict.items() if k == "stock")
    patched_fails = bool(patched_c) or bool(verdict and verdict["patched"]["failed"])
    code = EXIT_STILL if patched_fails else EXIT_FIXED if stock_fails else EXIT_OK
    report["exit_code"] = code
    report["advice"] = _advice(code, report)
    report["seconds"] = round(time.monotonic() - t0, 1)
    step("done")
    return code, report


def _advice(code: int, report: dict) -> str:
    line = report["line"]
    if code == EXIT_OK and not report["verdict"]:  # nothing was replayed
        return "unaffected: no fused all-reduce, so bugs A and B cannot occur."
    if code == EXIT_OK:
        untold = any(report.get(k) for k in CAVEATS)
        return (
            f"unaffected: stock vLLM {line} starts this deployment (cold and warm) in the replay"
            + (", except what it says it did not replay." if untold else ".")
        )
    if code == EXIT_FIXED:
        v = report["verdict"]
        cost = ""
        if v and v["stock"]["workspace_mib_per_rank"] and v["patched"]["workspace_mib_per_rank"]:
            s, p = v["stock"]["workspace_mib_per_rank"], v["patched"]["workspace_mib_per_rank"]
            cost = (
                f" (all-reduce workspace per rank: buffer {size(s['buffer_mib'])} -> "
                f"{size(p['buffer_mib'])}, Lamport {size(s['lamport_mib'])} -> "
                f"{size(p['lamport_mib'])})"
            )
        return (
            f"stock vLLM {line} crashes at start-up here; the tpfix wheel of {line} fixes it{cost}."
        )
    return (
        f"the tpfix wheel of {line} fails too: report this line; meanwhile start with "
        "-cc.pass_config.fuse_allreduce_rms=false (no fused all-reduce) or TP 1."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
    try:
        code, report = diagnose(argv, lambda s: print(wrap(s), file=sys.stderr, flush=True))
    except Fail as e:
        if as_json:
            print(json.dumps({"exit_code": EXIT_BAD, "error": str(e)}))
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD
    print(json.dumps(report, indent=1) if as_json else text(report))
    return code


if __name__ == "__main__":
    sys.exit(main())
