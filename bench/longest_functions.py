"""The longest functions of a package, by source lines (def line to last line, docstring included).

    python bench/longest_functions.py kvstudy 10          # this checkout
    python bench/longest_functions.py /tmp/base/kvstudy 5   # another checkout
"""
import ast
import sys
from pathlib import Path


def main(argv):
    root, most = Path(argv[0] if argv else "kvstudy"), int(argv[1]) if len(argv) > 1 else 10
    rows = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root.parent)}:{node.name}"))
    for length, name in sorted(rows, reverse=True)[:most]:
        print(length, name)


if __name__ == "__main__":
    main(sys.argv[1:])
