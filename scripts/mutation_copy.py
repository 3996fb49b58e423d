"""A copy of the checkout for a time-boxed mutation pass (issue #20; results in benchmarks/results/mutation.md).

mutmut mutates whole files; this copies the checkout to DEST and fences off with `# pragma: no mutate start/end`
every function of the target files but the ones named, so that only those are mutated, then appends a
`[tool.mutmut]` section that runs the given tests. Nothing in the checkout is changed.

    python scripts/mutation_copy.py /tmp/mut src/leantrain/training/trainer.py:forward_backward_step,_close_step \
        src/leantrain/training/guards.py:finite --tests tests/training/test_equivalence.py tests/test_checkpoint.py
    cd /tmp/mut && HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 mutmut run --max-children 2 && mutmut results

A file given without names is mutated whole (pick mutants by name on mutmut's command line instead: the fence
cannot always close inside a class before a multi-line signature).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("src", "tests", "benchmarks", "examples", "docs", "scripts", "pyproject.toml", "README.md")


def fence(path: Path, keep: set[str]) -> None:
    """Fence every function and class of `path` except the functions named in `keep`."""
    out, fenced = [], False
    for line in path.read_text().split("\n"):
        stripped = line.strip()
        if stripped.startswith(("def ", "class ", "@")):
            name = stripped.split("(")[0].split()[-1] if stripped.startswith("def ") else None
            indent = " " * (len(line) - len(line.lstrip()))
            if name in keep and fenced:
                out.append(indent + "# pragma: no mutate end")
                fenced = False
            elif name not in keep and not fenced:
                out.append(indent + "# pragma: no mutate start")
                fenced = True
        out.append(line)
    if fenced:
        out.append("# pragma: no mutate end")
    path.write_text("\n".join(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest", type=Path)
    p.add_argument("targets", nargs="+", help="FILE[:function,function...]")
    p.add_argument("--tests", nargs="+", required=True, help="the tests each mutant runs (pytest node ids)")
    args = p.parse_args(argv)
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, args.dest / name)
    files = []
    for target in args.targets:
        file, _, names = target.partition(":")
        files.append(file)
        if names:
            fence(args.dest / file, set(names.split(",")))
    with open(args.dest / "pyproject.toml", "a") as f:
        f.write(
            "\n[tool.mutmut]\n"
            'source_paths = ["src/"]\n'
            f"only_mutate = {json.dumps(files)}\n"
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:randomly"]\n'
            f"pytest_add_cli_args_test_selection = {json.dumps(args.tests)}\n"
            'process_isolation = "forkserver"\n'
        )
    print(f"{args.dest}: ready; cd there and run mutmut run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
