"""Reading ELF shared objects for the contract tier's ABI check (abi.py): the dynamic section (SONAME, DT_NEEDED,
RPATH/RUNPATH), the strong undefined references with the file each versioned one names, and which of a set of
names a library defines.

Two readers: pyelftools (a dependency of this package; symbol lookups go through the libraries' GNU hash tables, so
libtorch_cpu's ~80k exports are never listed) or, where it is absent (plain ``pytest`` with ``PYTHONPATH=src``),
binutils' ``readelf``; with neither, ``make_reader`` raises AbiUnavailable (one line) and the check is skipped.
``needed`` reads DT_NEEDED alone, with ``struct``: abi.py's quick scan for the libraries that link torch.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10
_PT_LOAD, _PT_DYNAMIC = 1, 2


def needed(path: Path) -> tuple[str, ...]:
    """DT_NEEDED of an ELF shared object, read with ``struct`` from the program headers and the dynamic segment
    alone; ValueError for a file that is not one (a linker script, a truncated file).

    Why a third reader: the ABI check's discovery looks at every shared object of sglang's dependency closure
    (~650 on a row) to find the ~30 that link torch; pyelftools needed 2.8 s for that (its parser builds every
    header through ``construct``), this 0.05 s, with the same answer on every file of the 0.5.17 row. The ~30
    found are then read by the full readers below."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
            raise ValueError(f"{path}: not an ELF file")
        wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
        # where e_phoff / e_phentsize, e_phnum sit, a program header's layout and the fields used of it (type,
        # offset, vaddr, filesz), and a dynamic entry (d_tag, d_val), for ELF64 and ELF32
        if wide:
            at_phoff, at_phnum, phoff_fmt, phdr, dyn_entry, used = 32, 54, "Q", "IIQQQQQQ", "qQ", (0, 2, 3, 5)
        else:
            at_phoff, at_phnum, phoff_fmt, phdr, dyn_entry, used = 28, 42, "I", "IIIIIIII", "iI", (0, 1, 2, 4)
        (phoff,) = struct.unpack_from(end + phoff_fmt, head, at_phoff)
        phentsize, phnum = struct.unpack_from(end + "HH", head, at_phnum)
        phdr, dyn_entry = end + phdr, end + dyn_entry
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
        if len(table) < phentsize * phnum or phentsize < struct.calcsize(phdr):
            raise ValueError(f"{path}: truncated program headers")
        loads, dynamic = [], None
        for i in range(phnum):
            fields = struct.unpack_from(phdr, table, i * phentsize)
            kind, offset, vaddr, filesz = (fields[j] for j in used)
            if kind == _PT_LOAD:
                loads.append((vaddr, offset, filesz))
            elif kind == _PT_DYNAMIC:
                dynamic = (offset, filesz)
        if dynamic is None:  # a static object needs nothing
            return ()
        fh.seek(dynamic[0])
        raw = fh.read(dynamic[1])
        tags, size = [], struct.calcsize(dyn_entry)
        for off in range(0, len(raw) - size + 1, size):
            tag, value = struct.unpack_from(dyn_entry, raw, off)
            if tag == _DT_NULL:
                break
            tags.append((tag, value))
        names = [v for t, v in tags if t == _DT_NEEDED]
        if not names:
            return ()
        strtab = next((v for t, v in tags if t == _DT_STRTAB), None)
        strsz = next((v for t, v in tags if t == _DT_STRSZ), None)
        # DT_STRTAB is an address: the PT_LOAD segment holding it says where it is in the file
        at = next((o + strtab - va for va, o, sz in loads if strtab is not None and va <= strtab < va + sz), None)
        if at is None or strsz is None:
            raise ValueError(f"{path}: no string table for DT_NEEDED")
        fh.seek(at)
        strings = fh.read(strsz)
        out = []
        for i in names:
            stop = strings.find(b"\0", i)
            if i >= len(strings) or stop < 0:
                raise ValueError(f"{path}: DT_NEEDED outside the string table")
            out.append(strings[i:stop].decode("utf-8", "replace"))
        return tuple(out)


class AbiUnavailable(RuntimeError):
    """The check cannot run here (no ELF reader, not an ELF platform, no torch); the message is one line."""


@dataclass(frozen=True)
class Dynamic:
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]


@dataclass(frozen=True)
class Ref:
    """A strong undefined reference of a library: its name and, for a versioned one, the file the version names."""

    name: str
    version_file: str | None = None


class PyElfReader:
    """pyelftools: dynamic section, undefined references, and name lookups through the GNU/SysV hash table."""

    name = "pyelftools"

    def __init__(self):
        from elftools.elf.elffile import ELFFile  # noqa: F401  (raises ImportError where pyelftools is absent)

        self._open: dict[str, tuple] = {}

    def _elf(self, path: Path):
        key = str(path)
        if key not in self._open:
            from elftools.elf.elffile import ELFFile
            from elftools.elf.hash import ELFHashSection, GNUHashSection

            fh = open(path, "rb")
            elf = ELFFile(fh)
            dynsym = elf.get_section_by_name(".dynsym")
            table = None
            for sec in elf.iter_sections():
                if isinstance(sec, GNUHashSection):
                    table = sec
                    break
                if isinstance(sec, ELFHashSection):
                    table = sec
            self._open[key] = (fh, elf, dynsym, table)
        return self._open[key]

    def close(self) -> None:
        for fh, *_ in self._open.values():
            fh.close()
        self._open.clear()

    def dynamic(self, path: Path) -> Dynamic:
        _, elf, _, _ = self._elf(path)
        soname, needed, rpath, runpath = None, [], [], []
        dyn = elf.get_section_by_name(".dynamic")
        if dyn is None:
            dyn = next((s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"), None)
        for tag in dyn.iter_tags() if dyn is not None else ():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_SONAME":
                soname = tag.soname
            elif kind == "DT_RPATH":
                rpath += tag.rpath.split(":")
            elif kind == "DT_RUNPATH":
                runpath += tag.runpath.split(":")
        return Dynamic(soname, tuple(needed), tuple(rpath), tuple(runpath))

    def undefined(self, path: Path) -> list[Ref]:
        _, elf, dynsym, _ = self._elf(path)
        if dynsym is None:
            return []
        versym = elf.get_section_by_name(".gnu.version")
        verneed = elf.get_section_by_name(".gnu.version_r")
        file_of: dict[int, str] = {}
        if verneed is not None:
            for vn, auxs in verneed.iter_versions():
                for aux in auxs:
                    file_of[aux["vna_other"]] = vn.name
        out = []
        for i, sym in enumerate(dynsym.iter_symbols()):
            if i == 0 or sym["st_shndx"] != "SHN_UNDEF" or sym["st_info"]["bind"] != "STB_GLOBAL" or not sym.name:
                continue
            ndx = versym.get_symbol(i)["ndx"] if versym is not None else "VER_NDX_GLOBAL"
            out.append(Ref(sym.name, file_of.get(ndx & 0x7FFF) if isinstance(ndx, int) else None))
        return out

    def defines(self, path: Path, names: Iterable[str]) -> set[str]:
        _, _, dynsym, table = self._elf(path)
        if dynsym is None:
            return set()
        found = set()
        if table is not None:
            for name in names:
                sym = table.get_symbol(name)
                if sym is not None and sym["st_shndx"] != "SHN_UNDEF":
                    found.add(name)
            return found
        wanted = set(names)  # no hash section (unusual): one pass over the table
        return {s.name for s in dynsym.iter_symbols() if s.name in wanted and s["st_shndx"] != "SHN_UNDEF"}


class ReadelfReader:
    """binutils' readelf, for environments without pyelftools (output parsed once per library and cached)."""

    name = "readelf"

    def __init__(self, exe: str | None = None):
        self.exe = exe or shutil.which("readelf")
        if self.exe is None:
            raise FileNotFoundError("readelf")
        self._syms: dict[str, tuple[list[Ref], frozenset[str]]] = {}

    def _run(self, *args: str) -> str:
        out = subprocess.run([self.exe, "-W", *args], capture_output=True, text=True, errors="replace")
        if out.returncode != 0:
            raise OSError(f"readelf {' '.join(args)}: {(out.stderr or out.stdout).strip().splitlines()[:1]}")
        return out.stdout

    def close(self) -> None:
        self._syms.clear()

    def dynamic(self, path: Path) -> Dynamic:
        soname, needed, rpath, runpath = None, [], [], []
        for line in self._run("-d", str(path)).splitlines():
            m = re.search(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+[^\[]*\[(.*)\]\s*$", line)
            if not m:
                continue
            kind, value = m.groups()
            if kind == "NEEDED":
                needed.append(value)
            elif kind == "SONAME":
                soname = value
            elif kind == "RPATH":
                rpath += value.split(":")
            else:
                runpath += value.split(":")
        return Dynamic(soname, tuple(needed), tuple(rpath), tuple(runpath))

    def _symbols(self, path: Path) -> tuple[list[Ref], frozenset[str]]:
        key = str(path)
        if key not in self._syms:
            file_of: dict[int, str] = {}
            current = None
            for line in self._run("-V", str(path)).splitlines():
                m = re.search(r"File:\s*(\S+)", line)
                if m:
                    current = m.group(1)
                    continue
                m = re.search(r"Name:\s*\S+\s+Flags:.*Version:\s*(\d+)", line)
                if m and current:
                    file_of[int(m.group(1))] = current
            refs, defined = [], set()
            for line in self._run("--dyn-syms", str(path)).splitlines():
                parts = line.split()
                # Num: Value Size Type Bind Vis Ndx Name [(version index)]
                if len(parts) < 8 or not parts[0].endswith(":") or not parts[0][:-1].isdigit():
                    continue
                bind, ndx, raw = parts[4], parts[6], parts[7]
                name = raw.split("@", 1)[0]
                if not name:
                    continue
                if ndx != "UND":
                    defined.add(name)
                elif bind == "GLOBAL":
                    vfile = None
                    if "@" in raw:
                        m = re.search(r"\((\d+)\)", line)
                        vfile = file_of.get(int(m.group(1))) if m else raw.split("@", 1)[1]
                    refs.append(Ref(name, vfile))
            self._syms[key] = (refs, frozenset(defined))
        return self._syms[key]

    def undefined(self, path: Path) -> list[Ref]:
        return list(self._symbols(path)[0])

    def defines(self, path: Path, names: Iterable[str]) -> set[str]:
        defined = self._symbols(path)[1]
        return {n for n in names if n in defined}


def make_reader(prefer: str | None = None):
    """pyelftools, else readelf; AbiUnavailable (one line) when neither is here. ``prefer`` forces one (tests)."""
    for kind in (prefer,) if prefer else ("pyelftools", "readelf"):
        try:
            return PyElfReader() if kind == "pyelftools" else ReadelfReader()
        except (ImportError, FileNotFoundError):
            continue
    raise AbiUnavailable(
        "no ELF reader: neither pyelftools (pip install pyelftools) nor binutils' readelf is available"
    )
