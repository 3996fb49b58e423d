"""Reading a 100 MB CSV: the pyarrow fast path against the repairing reader.

    python benchmarks/read_tables.py               # ~100 MB, 2 rounds; writes benchmarks/results/read_tables.{md,json}
    python benchmarks/read_tables.py --mb 20       # a quicker look

The file is generated (seeded) from SST-2's training sentences when ../shared/data is present, else from a
word list, with a share of accented words, curly quotes, quoted fields holding commas and HTML entities, so
that the readers have real repair work. Each reading runs in its own process (its peak RSS is its own) and
the variants alternate round by round, so a neighbour's load falls on all of them alike; compare the ratios
within one run, never the seconds across runs. Variants:

- `fast`: `read_table` as shipped: pyarrow's CSV reader for valid UTF-8, ftfy only on cells that may need it;
- `repairing`: the repairing reader (`ReadOptions(repair="always")`): each line decoded alone, Python's csv;
- `repair-every-cell`: the repairing reader with ftfy on every text cell, as every file was read before
  (in the first round only: it takes about ten times as long as the others);
- `fast, damaged file`: the same file with one Latin-1 byte near its end: pyarrow refuses it, the
  repairing reader takes over (the cost of trying the fast path first).

Every variant's frame is hashed: the run fails unless all four read the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
VARIANTS = ("fast", "repairing", "repair-every-cell", "fast, damaged file")
EXTRAS = ["café", "naïve", "“quoted”", "don’t", "&amp;", "Zürich", "crème brûlée", "東京"]


def generate(path: Path, megabytes: float, seed: int = 0) -> int:
    """Write a CSV of about `megabytes` MB: id, text, label. Returns the number of rows."""
    rng = random.Random(seed)
    source = DATA / "sst2" / "train.tsv"
    if source.is_file():
        lines = source.read_text(encoding="utf-8").splitlines()[1:]
        sentences = [line.rsplit("\t", 1)[0].strip() for line in lines]
    else:
        words = [
            "the",
            "a",
            "film",
            "story",
            "acting",
            "plot",
            "good",
            "bad",
            "quite",
            "very",
            "slow",
            "funny",
            "dull",
            "moving",
        ]
        sentences = [" ".join(rng.choices(words, k=rng.randint(3, 30))) for _ in range(50_000)]
    target, written, rows = megabytes * 1e6, 0, 0
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("id,text,label\n")
        while written < target:
            text = rng.choice(sentences)
            if rng.random() < 0.05:
                text = f"{text} {rng.choice(EXTRAS)}"
            if '"' in text or "," in text:
                text = '"' + text.replace('"', '""') + '"'
            line = f"{rows},{text},{rng.randint(0, 1)}\n"
            f.write(line)
            written += len(line.encode())
            rows += 1
    return rows


def read_once(variant: str, path: Path) -> dict:
    """One reading in this process: seconds, rows, a hash of the frame, peak RSS."""
    import resource

    import pandas as pd

    from leantrain.data import sources

    options = sources.ReadOptions(repair="always" if variant in ("repairing", "repair-every-cell") else "auto")
    if variant == "repair-every-cell":
        sources._MAY_NEED_REPAIR = r"(?s)."  # every non-empty cell through ftfy
    repair_seconds = 0.0
    repair = sources._repair_text_columns

    def timed_repair(*args):
        nonlocal repair_seconds
        t = time.perf_counter()
        repair(*args)
        repair_seconds += time.perf_counter() - t

    sources._repair_text_columns = timed_repair
    import ftfy  # noqa: F401  (imported by the first repair otherwise: not part of reading)
    import pyarrow.csv  # noqa: F401

    start = time.perf_counter()
    df, report = sources.read_table(str(path), options=options)
    seconds = time.perf_counter() - start
    digest = int(pd.util.hash_pandas_object(df, index=True).sum()) & 0xFFFFFFFFFFFF
    return {
        "seconds": seconds,
        "repair_seconds": repair_seconds,
        "rows": len(df),
        "rows_repaired": report.rows_repaired,
        "hash": digest,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _load() -> str:
    """`uptime`'s line: how busy the shared machine was."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _environment() -> dict:
    import ftfy
    import pandas as pd
    import pyarrow as pa

    cpu = "?"
    if Path("/proc/cpuinfo").exists():
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "?")  # fmt: skip
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "pyarrow": pa.__version__,
        "ftfy": ftfy.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated file in MB")
    parser.add_argument("--rounds", type=int, default=2, help="readings of each variant (alternating)")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md from the saved .json")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / "read_tables.json").read_text()))
        return 0
    if args.child:
        print(json.dumps(read_once(args.child[0], Path(args.child[1]))))
        return 0

    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        clean, damaged = Path(tmp) / "clean.csv", Path(tmp) / "damaged.csv"
        rows = generate(clean, args.mb)
        raw = clean.read_bytes()
        cut = raw.rfind(b"\n", 0, len(raw) - 1000) + 1  # a line near the end gets a Latin-1 byte
        damaged.write_bytes(raw[:cut] + raw[cut:].replace(b"film", b"f\xefm", 1).replace(b"a", b"\xe9", 1))
        size_mb = len(raw) / 1e6
        del raw
        load_before = _load()
        results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for round_ in range(args.rounds):
            for variant in VARIANTS:
                if variant == "repair-every-cell" and round_ > 0:
                    continue  # ~10x the others: once is enough for its ratio
                path = damaged if variant == "fast, damaged file" else clean
                out = subprocess.run(
                    [sys.executable, __file__, "--child", variant, str(path)],
                    capture_output=True, text=True, env=env, check=True,
                )  # fmt: skip
                results[variant].append(json.loads(out.stdout))
                print(f"round {round_ + 1} {variant}: {results[variant][-1]}", file=sys.stderr, flush=True)
        load_after = _load()
    clean_hashes = {r["hash"] for v in VARIANTS[:3] for r in results[v]}
    if len(clean_hashes) != 1:
        raise SystemExit(f"the readers disagree on the clean file: {results}")
    record = {
        "file_mb": round(size_mb, 1),
        "rows": rows,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": load_after,
        "environment": _environment(),
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "read_tables.json").write_text(json.dumps(record, indent=2) + "\n")
    write_report(record)
    return 0


def write_report(record: dict) -> None:
    """benchmarks/results/read_tables.md from the measurements (`--report-only` rewrites it from the .json)."""
    results, env = record["results"], record["environment"]
    best = {v: min(r["seconds"] for r in results[v]) for v in VARIANTS}
    lines = [
        f"# Reading a {record['file_mb']:.0f} MB CSV ({record['rows']:,} rows): fast path against the repairing reader",
        "",
        "Written by `python benchmarks/read_tables.py` (see its docstring for the file and the variants).",
        f"Machine: {env['cpu']}, {env['cores']} cores, shared. `uptime` before: `{record['load_before']}`; "
        f"after: `{record['load_after']}`. Versions: Python {env['python']}, pandas {env['pandas']}, pyarrow "
        f"{env['pyarrow']}, ftfy {env['ftfy']}. Each reading in its own process, variants alternating in "
        f"{record['rounds']} rounds (repair-every-cell in the first only). The load moved a lot during the run: "
        "compare the ratios within a round, not seconds across rounds or runs.",
        "",
        "| variant | round | seconds | repair (ftfy) s | parse s | peak RSS MiB | rows | rows repaired |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        for n, r in enumerate(results[v], 1):
            lines.append(
                f"| {v} | {n} | {r['seconds']:.1f} | {r['repair_seconds']:.1f} | "
                f"{r['seconds'] - r['repair_seconds']:.1f} | {r['peak_rss_mib']:.0f} | {r['rows']:,} | "
                f"{r['rows_repaired']:,} |"
            )
    lines += [
        "",
        "All readings of the clean file give the same frame (hash of every cell checked).",
        "",
        "Ratios within each round (same minutes, same load):",
        "",
        "| round | repairing / fast | parsing alone: repairing / fast | ftfy on every cell (before) / fast | "
        "damaged file, fast path tried first / repairing |",
        "|---|---|---|---|---|",
    ]

    def parse(r: dict) -> float:
        return r["seconds"] - r["repair_seconds"]

    for n in range(record["rounds"]):
        fast, rep = results["fast"][n], results["repairing"][n]
        every = (
            results["repair-every-cell"][n]["seconds"] / fast["seconds"]
            if n < len(results["repair-every-cell"])
            else None
        )
        damaged = results["fast, damaged file"][n]["seconds"] / rep["seconds"]
        lines.append(
            f"| {n + 1} | {rep['seconds'] / fast['seconds']:.2f} | {parse(rep) / parse(fast):.2f} | "
            f"{'-' if every is None else f'{every:.2f}'} | {damaged:.2f} |"
        )
    lines += ["", f"Best of each: {', '.join(f'{v} {best[v]:.1f} s' for v in VARIANTS)}."]
    (RESULTS / "read_tables.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
