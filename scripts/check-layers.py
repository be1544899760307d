#!/usr/bin/env python3
"""Check that the modules of src/ import each other in one direction only.

Three checks:
- the layer list in src/lib.rs's doc (`//! N. name: ...` lines, top layer first, with
  the `[`module`]` links of that layer): every top-level module is in exactly one
  layer, and no module names a module of a higher layer (an upward import);
- the crate's top-level modules (`crate::http`, `crate::shard`, ...): no cycle at all;
- inside each module folder, its sibling files (`ws/conn.rs`, `ws/frame.rs`, ...):
  no cycle among them (the folder's `mod.rs` may name its children and they may use
  what it re-exports, so `mod.rs` is left out of this level).

A reference is any `crate::name` / `super::name` path outside a comment. The order
found (lowest first) is printed. Exit status 1 on an upward import, a module missing from
the layer list, or a cycle, with the modules and the lines at fault.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
CRATE_REF = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# `use crate::{a, b::c}`: every first segment inside the braces.
CRATE_GROUP = re.compile(r"\bcrate::\{([^}]*)\}")
SUPER_REF = re.compile(r"\bsuper::([a-z_][a-z0-9_]*)")
LAYER_LINE = re.compile(r"^//! (\d+)\. [a-z-]+: (.*)$")
DOC_LINE = re.compile(r"^//!    (\S.*)$")
LINK = re.compile(r"\[`([a-z_][a-z0-9_]*)`\]")


def strip_parens(text):
    """The text outside parentheses: a layer names its modules outside them, and may
    mention others inside them (descriptions) without placing them."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def layers():
    """Map each module named in lib.rs's layer list to its layer number, and list the
    names given twice. A layer is a `//! N. name: ...` line and the `//!    ...` lines
    indented under it; its modules are the `[`name`]` links outside parentheses."""
    texts, current = {}, None
    with open(os.path.join(ROOT, "lib.rs"), encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = LAYER_LINE.match(line)
            if m:
                current = int(m.group(1))
                texts[current] = texts.get(current, "") + " " + m.group(2)
            elif current is not None and DOC_LINE.match(line):
                texts[current] += " " + DOC_LINE.match(line).group(1)
            else:
                current = None
    found, twice = {}, []
    for number, text in sorted(texts.items()):
        for name in LINK.findall(strip_parens(text)):
            if name in found:
                twice.append(name)
            found.setdefault(name, number)
    return found, twice


def code_lines(path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            stripped = line.split("//", 1)[0]
            if stripped.strip():
                yield n, stripped


def top_module(rel):
    parts = rel.split(os.sep)
    if len(parts) == 1:
        name = parts[0][:-3]
        return None if name in ("lib", "main") else name
    return parts[0]


def find_cycle(graph):
    """Return one cycle as a list of nodes, or None (iterative DFS, colours)."""
    colour = {n: 0 for n in graph}
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            if nxt not in colour:
                continue
            if colour[nxt] == 1:
                return path[path.index(nxt):] + [nxt]
            if colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    return None


def topo(graph):
    order, seen = [], set()

    def visit(n):
        if n in seen:
            return
        seen.add(n)
        for m in sorted(graph[n]):
            visit(m)
        order.append(n)

    for n in sorted(graph):
        visit(n)
    return order


def main():
    files = []
    for dirpath, _, names in os.walk(ROOT):
        for name in names:
            if name.endswith(".rs"):
                files.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    tops = {top_module(f) for f in files} - {None}
    top_graph = {t: set() for t in tops}
    where = {}
    sibling_graphs = {}
    for rel in sorted(files):
        me = top_module(rel)
        parts = rel.split(os.sep)
        sibling = parts[1][:-3] if len(parts) == 2 and parts[1] != "mod.rs" else None
        if sibling:
            sibling_graphs.setdefault(parts[0], {}).setdefault(sibling, set())
        for n, line in code_lines(os.path.join(ROOT, rel)):
            grouped = [
                seg.strip().split("::")[0].split()[0]
                for group in CRATE_GROUP.findall(line)
                for seg in group.split(",")
                if seg.strip()
            ]
            for target in CRATE_REF.findall(line) + grouped:
                if me and target in tops and target != me:
                    top_graph[me].add(target)
                    where.setdefault((me, target), f"{rel}:{n}")
                if sibling and target == me:
                    rest = re.findall(r"\bcrate::" + me + r"::([a-z_][a-z0-9_]*)", line)
                    for r in rest:
                        if r != sibling:
                            sibling_graphs[parts[0]].setdefault(sibling, set()).add(r)
                            where.setdefault((f"{me}/{sibling}", f"{me}/{r}"), f"{rel}:{n}")
            if sibling:
                for target in SUPER_REF.findall(line):
                    if target != sibling:
                        sibling_graphs[parts[0]][sibling].add(target)
                        where.setdefault((f"{me}/{sibling}", f"{me}/{target}"), f"{rel}:{n}")
    failed = False
    layer, twice = layers()
    for t in sorted(tops):
        if t not in layer:
            failed = True
            print(f"module {t} is in no layer of src/lib.rs's layer list")
    for name in sorted(set(twice)):
        failed = True
        print(f"module {name} is named in two layers of src/lib.rs's layer list")
    for name in sorted(set(layer) - tops):
        failed = True
        print(f"src/lib.rs's layer list names {name}, which is no module of src/")
    for a in sorted(top_graph):
        for b in sorted(top_graph[a]):
            if a in layer and b in layer and layer[b] > layer[a]:
                failed = True
                print(f"upward import: {a} (layer {layer[a]}) names {b} (layer {layer[b]}) at {where.get((a, b))}")
    cycle = find_cycle(top_graph)
    if cycle:
        failed = True
        print("cycle between top-level modules: " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            print(f"  {a} -> {b} at {where.get((a, b))}")
    for folder, graph in sorted(sibling_graphs.items()):
        graph = {k: {v for v in vs if v in graph} for k, vs in graph.items()}
        cycle = find_cycle(graph)
        if cycle:
            failed = True
            print(f"cycle inside {folder}/: " + " -> ".join(cycle))
            for a, b in zip(cycle, cycle[1:]):
                print(f"  {a} -> {b} at {where.get((f'{folder}/{a}', f'{folder}/{b}'))}")
    if failed:
        return 1
    print(f"no upward import, no import cycle ({len(tops)} modules in {len(set(layer.values()))} layers); modules from the bottom up:")
    print("  " + " < ".join(topo(top_graph)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
