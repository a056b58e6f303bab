#!/usr/bin/env python3
"""Compares the machine code of dissect's kernels between two revisions, function by function.

Timing cannot tell a 2 % change on a shared 2-vCPU machine (bench/README.md: the same binary
against itself spans 0.55-1.80 per cell), but a refactoring of the kernels that leaves their
instructions as they were cannot have made them slower. This script compiles src/kernels.cpp,
the unit that holds every kernel (include/dissect/kernels/compile_once.hpp), at both revisions
with the same compiler and flags, disassembles both objects and compares each function's
instructions, with addresses and symbol offsets normalised (and, with --registers, register
names too: the same instructions in another register assignment).

    bench/compare_kernel_code.py OLD_REV [NEW_REV]      # NEW_REV: the working tree

A kernel whose body moved into another function (an entry point that now tail-calls a shared
body) is compared with that body: --moved OLD_NAME=NEW_NAME, prefixes of the demangled names.
Exit status 0 when every function present in both is identical, 1 otherwise.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLAGS = ["-std=c++20", "-O2", "-DNDEBUG", "-DDISSECT_SEPARATE_KERNELS"]


def source_tree(rev, scratch):
    """A directory holding include/ and src/ as they are at rev (None: the working tree)."""
    if rev is None:
        return REPO
    out = Path(scratch) / rev.replace("/", "_")
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "include", "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def disassemble(tree, compiler, scratch, tag):
    obj = Path(scratch) / f"{tag}.o"
    subprocess.run([compiler, *FLAGS, f"-I{tree}/include", "-I/usr/include/eigen3", "-c",
                    str(tree / "src" / "kernels.cpp"), "-o", str(obj)], check=True)
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)], check=True,
                          capture_output=True, text=True).stdout


def functions(listing, registers):
    """{demangled name without clone suffixes: [normalised instruction, ...]}."""
    result, name = {}, None
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            name = re.sub(r" \[clone [^]]*\]", "", header.group(1))
            result.setdefault(name, [])
            continue
        if name is None or not line.startswith(" "):
            continue
        parts = line.split("\t")
        text = parts[-1].strip() if len(parts) > 1 else ""
        text = re.sub(r"#.*", "", text)
        text = re.sub(r"\b[0-9a-f]+ <.*$", "ADDR", text)  # branch targets, as offsets move
        if registers:
            text = re.sub(r"%[xyz]mm\d+", "%V", text)
            text = re.sub(r"%k\d", "%K", text)
            text = re.sub(r"%r\d+[dwb]?|%[re]?[abcd]x|%[abcd]l|%[re]?[sd]il?|%[re]?[sb]pl?", "%R",
                          text)
        result[name].append(text.strip())
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the revision to compare against")
    parser.add_argument("new", nargs="?", help="the other revision (default: the working tree)")
    parser.add_argument("--compiler", default="g++")
    parser.add_argument("--registers", action="store_true",
                        help="also normalise register names")
    parser.add_argument("--moved", action="append", default=[], metavar="OLD=NEW",
                        help="compare old function OLD (name prefix) with new function NEW")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        old = functions(disassemble(source_tree(args.old, scratch), args.compiler, scratch, "old"),
                        args.registers)
        new = functions(disassemble(source_tree(args.new, scratch), args.compiler, scratch, "new"),
                        args.registers)
    for pair in args.moved:
        old_prefix, new_prefix = pair.split("=", 1)
        old_names = [n for n in old if n.startswith(old_prefix)]
        new_names = [n for n in new if n.startswith(new_prefix)]
        if len(old_names) != 1 or len(new_names) != 1:
            sys.exit(f"--moved {pair}: expected one function on each side, found "
                     f"{len(old_names)} and {len(new_names)}")
        new.pop(old_names[0], None)
        old[new_names[0]] = old.pop(old_names[0])

    same, differ = 0, []
    for name in sorted(set(old) & set(new)):
        if old[name] == new[name]:
            same += 1
        else:
            differ.append(name)
    for name in differ:
        print(f"differs: {name} ({len(old[name])} -> {len(new[name])} instructions)")
    for name in sorted(set(old) - set(new)):
        print(f"only in old: {name}")
    for name in sorted(set(new) - set(old)):
        print(f"only in new: {name}")
    count = sum(len(old[n]) for n in set(old) & set(new))
    print(f"{same} functions identical, {len(differ)} differ ({count} instructions compared"
          f"{', register names normalised' if args.registers else ''})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
