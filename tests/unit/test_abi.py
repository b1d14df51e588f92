"""mtpmatrix.tiers.compat.abi on small real ELF files built with g++ at test time: a fake torch whose next release drops two
symbols, an extension built against the old one, a CUDA 12 runtime under a CUDA 13 torch, and a fake installed
environment (dist-info RECORDs) for the discovery. Every check runs with both ELF readers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.tiers.compat import abi, load_scope
from mtpmatrix.tiers.compat.elf import AbiUnavailable, Ref, make_reader, needed

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++ to build the ELF fixtures")

# torch "2.11": what the extension was built against
OLD_TORCH = r"""
namespace c10 { struct StorageImpl {}; namespace impl { namespace cow {
    void materialize_cow_storage(StorageImpl&) {} } } }
namespace torch { struct Library { void _def(int); }; void Library::_def(int) {} }
namespace at { void kept(int) {} }
"""
# torch "2.13": materialize_cow_storage and Library::_def are gone
NEW_TORCH = r"""
namespace at { void kept(int) {} }
namespace c10 { void something_new() {} }
"""
C10_CUDA = "namespace c10 { namespace cuda { void device_count() {} } }\n"
# a non-torch library with versioned symbols, one of them (oddly) in namespace c10
VERSIONED = 'namespace c10 { void thing() {} }\nextern "C" void plain_versioned() {}\n'
VERSION_SCRIPT = "VER_1 { global: *; };\n"
CUDART12 = 'extern "C" int cudaMalloc(void**, unsigned long) { return 0; }\n'
EXTENSION = r"""
#include <string>
namespace c10 { struct StorageImpl {};
    namespace impl { namespace cow { void materialize_cow_storage(StorageImpl&); } } }
namespace torch { struct Library { void _def(int); }; }
namespace at { void kept(int); void maybe() __attribute__((weak)); }   // weak: may stay unresolved
namespace c10 { void thing(); }
extern "C" void plain_versioned();
extern "C" int cudaMalloc(void**, unsigned long);
extern "C" int PyInit_ops() {
    c10::StorageImpl s; c10::impl::cow::materialize_cow_storage(s);
    torch::Library l; l._def(1); at::kept(2);
    if (at::maybe) at::maybe();
#ifdef USE_VERSIONED
    c10::thing(); plain_versioned();
#endif
#ifdef USE_CUDART
    void* p; cudaMalloc(&p, 8);
#endif
    std::string text("a"); text += "b";   // a GLIBCXX-versioned libstdc++ reference
    return (int)text.size();
}
"""


def _gxx(out: Path, source: str, *args: str, soname: str | None = None) -> Path:
    src = out.parent / (out.name.replace(".", "_") + ".cpp")
    src.write_text(source)
    cmd = [GXX, "-shared", "-fPIC", "-o", str(out), str(src), *args]
    if soname:
        cmd.append(f"-Wl,-soname,{soname}")
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    """Built once: old/new fake torch folders, a versioned non-torch lib, libcudart.so.12 and extensions."""
    if GXX is None:
        pytest.skip("needs g++ to build the ELF fixtures")
    root = tmp_path_factory.mktemp("elf")
    old, new, other = root / "torch_old", root / "torch_new", root / "other"
    for d in (old, new, other):
        d.mkdir()
    _gxx(old / "libtorch_cpu.so", OLD_TORCH, soname="libtorch_cpu.so")
    _gxx(old / "libc10_cuda.so", C10_CUDA, soname="libc10_cuda.so")
    _gxx(new / "libtorch_cpu.so", NEW_TORCH, soname="libtorch_cpu.so")
    (other / "ver.map").write_text(VERSION_SCRIPT)
    _gxx(other / "libver.so.1", VERSIONED, f"-Wl,--version-script={other / 'ver.map'}", soname="libver.so.1")
    _gxx(other / "libcudart.so.12", CUDART12, soname="libcudart.so.12")
    # --no-as-needed: keep libc10_cuda.so in DT_NEEDED although this small extension uses none of its symbols
    ext = _gxx(root / "ops.abi3.so", EXTENSION, f"-L{old}", "-ltorch_cpu", "-Wl,--no-as-needed", "-lc10_cuda")
    # found through RUNPATH $ORIGIN/other, as wheels find their bundled libraries
    ext_versioned = _gxx(
        root / "ops_versioned.so",
        EXTENSION,
        "-DUSE_VERSIONED",
        f"-L{old}",
        "-ltorch_cpu",
        str(other / "libver.so.1"),
        "-Wl,-rpath,$ORIGIN/other",
    )
    ext_cuda = _gxx(
        root / "ops_cuda.so",
        EXTENSION,
        "-DUSE_CUDART",
        f"-L{old}",
        "-ltorch_cpu",
        str(other / "libcudart.so.12"),
        "-Wl,-rpath,$ORIGIN/other",
    )
    return {
        "root": root,
        "old": old,
        "new": new,
        "other": other,
        "ext": ext,
        "ext_versioned": ext_versioned,
        "ext_cuda": ext_cuda,
    }


@pytest.fixture(params=["pyelftools", "readelf"])
def reader(request):
    try:
        r = make_reader(request.param)
    except AbiUnavailable:
        pytest.skip(f"{request.param} is not available here")
    yield r
    r.close()


def torch_dir(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.glob("*.so")}


def scope_for(reader, folder: Path, **kw) -> load_scope.LoadScope:
    return load_scope.LoadScope(reader, torch_dir(folder), system_dirs=load_scope.loader_dirs(), **kw)


# ------------------------------------------------------------------------------------------------ the symbol check


def test_extension_passes_against_the_torch_it_was_built_with(elf, reader):
    res = abi.check_library(elf["ext"], scope_for(reader, elf["old"]))
    assert not res.broken, res
    assert res.torch_refs == 3  # materialize_cow_storage, Library::_def, at::kept (the weak at::maybe is not one)
    assert res.missing_symbols == [] and res.missing_torch_libs == []


def test_extension_fails_against_a_torch_that_dropped_symbols(elf, reader):
    """The scenario of sgl_kernel under torch 2.13: the two dropped symbols are named, demangled; the weak reference
    at::maybe (defined by neither torch) and the libstdc++ references are not."""
    res = abi.check_library(elf["ext"], scope_for(reader, elf["new"]), label="pkg/ops.abi3.so")
    assert res.broken
    assert res.missing_symbols == [
        "_ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE",
        "_ZN5torch7Library4_defEi",
    ]
    if shutil.which("c++filt"):
        assert res.missing_demangled == [
            "c10::impl::cow::materialize_cow_storage(c10::StorageImpl&)",
            "torch::Library::_def(int)",
        ]
    # c10_cuda is not shipped by the new torch: a DT_NEEDED torch library it lacks (a CPU build, say)
    assert res.missing_torch_libs == ["libc10_cuda.so"]
    report = abi.AbiReport(
        torch_version="2.13.0",
        torch_cuda="13.0",
        reader=reader.name,
        libraries=[res],
        seconds=0.1,
        distributions=["pkg 1.0"],
    )
    head, *details = report.failure_message().splitlines()
    assert head.startswith("torch 2.13.0 does not define 2 symbol(s) that 1 native library need: ")
    assert head.endswith(
        "-- needed by pkg/ops.abi3.so (2); torch 2.13.0 ships no libc10_cuda.so -- needed by pkg/ops.abi3.so"
    )
    if shutil.which("c++filt"):
        assert "need: c10::impl::cow::materialize_cow_storage, torch::Library::_def -- " in head
        assert details == [
            "  pkg/ops.abi3.so:",
            "    c10::impl::cow::materialize_cow_storage(c10::StorageImpl&)",
            "    torch::Library::_def(int)",
        ]


def test_torch_symbol_found_in_another_torch_library_counts(elf, reader, tmp_path):
    """The lookup covers every torch library in the scope, not only the one the extension was linked against."""
    newer = tmp_path / "torch_split"
    newer.mkdir()
    _gxx(
        newer / "libtorch_cpu.so",
        NEW_TORCH + OLD_TORCH.replace("namespace at { void kept(int) {} }", ""),
        soname="libtorch_cpu.so",
    )
    shutil.copy(elf["old"] / "libc10_cuda.so", newer)
    assert not abi.check_library(elf["ext"], scope_for(reader, newer)).broken


def test_versioned_references_belong_to_their_library(elf, reader, tmp_path):
    """c10::thing is versioned (VER_1 of libver.so.1): with libver present it resolves there; with libver absent it is
    still libver's, never reported as a missing torch symbol."""
    present = abi.check_library(elf["ext_versioned"], scope_for(reader, elf["new"]))
    assert present.absent_libs == []
    moved = tmp_path / "ops_versioned.so"
    shutil.copy(elf["ext_versioned"], moved)  # away from $ORIGIN/other: libver.so.1 is not found
    gone = abi.check_library(moved, scope_for(reader, elf["new"]))
    assert gone.absent_libs == ["libver.so.1"]
    # only the two dropped torch symbols, in both cases
    assert (
        present.missing_symbols
        == gone.missing_symbols
        == ["_ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE", "_ZN5torch7Library4_defEi"]
    )
    # the control: the same name unversioned would have been torch's, and missing
    assert abi.is_torch_symbol(Ref("_ZN3c105thingEv"))
    refs = {r.name: r for r in reader.undefined(elf["ext_versioned"])}
    assert refs["_ZN3c105thingEv"].version_file == "libver.so.1"
    assert refs["_ZN5torch7Library4_defEi"].version_file is None
    assert "_ZN2at5maybeEv" not in refs  # weak undefined: not a strong reference


# ------------------------------------------------------------------------------------------------ CUDA majors


def test_cuda_runtime_major_must_match_torch(elf, reader):
    res = abi.check_library(elf["ext_cuda"], scope_for(reader, elf["old"]), label="pkg/ops_cuda.so")
    assert res.cuda_majors == {"libcudart.so.12": 12}
    assert abi.cuda_mismatches([res], "13.0") == ["pkg/ops_cuda.so needs libcudart.so.12 (CUDA 12)"]
    assert abi.cuda_mismatches([res], "12.8") == []


@pytest.mark.parametrize(
    "soname,major",
    [("libcudart.so.13", 13), ("libcublasLt.so.12", 12), ("libcudart.faf08d9a.so.13", 13), ("libnvrtc.so.13", 13)],
)
def test_cuda_major_sonames(soname, major):
    assert int(abi.CUDA_MAJOR_SONAME.match(soname).group(2)) == major


@pytest.mark.parametrize("soname", ["libcufft.so.12", "libcudnn.so.9", "libcuda.so.1", "libcusparse.so.12"])
def test_sonames_whose_major_is_not_the_cuda_major_are_ignored(soname):
    assert abi.CUDA_MAJOR_SONAME.match(soname) is None


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name,torch",
    [
        ("_ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE", True),
        ("_ZNK2at10TensorBase4sizeEl", True),
        ("_ZTVN3c1011StorageImplE", True),  # vtable
        ("_Z16THPVariable_WrapRKN2at10TensorBaseE", True),  # global-namespace function of torch's Python bindings
        ("aoti_torch_get_data_ptr", True),
        # torchcodec's own constructor, with torch::stable::Tensor in its parameters: torchcodec's to define
        (
            "_ZN8facebook10torchcodec12VideoEncoderC1ERKN5torch6stable6TensorEdSt17basic_string_viewIcSt11char_traitsIcE"
            "ERKNS0_18VideoStreamOptionsE",
            False,
        ),
        (
            "_ZNSt6vectorIN3c106IValueESaIS1_EE17_M_realloc_insertIJS1_EEEvN9__gnu_cxx17__normal_iteratorIPS1_S3_EEDpOT_",
            False,
        ),  # a std:: template instantiated with a torch type
        ("_Z7catalogv", False),  # "at" inside another name
        ("cuPointerGetAttribute", False),
        ("PyLong_FromLong", False),
    ],
)
def test_torch_symbol_attribution(name, torch):
    assert abi.is_torch_symbol(Ref(name)) is torch


def test_versioned_reference_is_torch_only_when_its_version_is_torch_s():
    assert not abi.is_torch_symbol(Ref("_ZN3c105thingEv", "libver.so.1"))
    assert abi.is_torch_symbol(Ref("_ZN3c105thingEv", "libc10.so"))


@pytest.mark.parametrize(
    "soname,torch",
    [
        ("libtorch.so", True),
        ("libtorch_cuda.so", True),
        ("libc10_cuda.so", True),
        ("libtorch_python.so", True),
        ("libtorchaudio.abi3.so", False),
        ("libtorchcodec_core4.so", False),
        ("libc10.so.1", False),
    ],
)
def test_torch_sonames(soname, torch):
    assert bool(abi.TORCH_SONAME.match(soname)) is torch


@pytest.mark.parametrize(
    "filename,other",
    [
        ("libtorch_c_dlpack_addon_torch26-cpu.so", True),
        ("libtorch_c_dlpack_addon_torch211-cuda.so", False),
        ("common_ops.abi3.so", False),
        ("libtorchaudio.abi3.so", False),
    ],
)
def test_per_release_builds_for_another_torch_are_recognised(filename, other):
    assert abi.built_for_other_torch(filename, "2.11.0") is other


def test_short_name_drops_the_parameter_list():
    assert (
        abi.short_name("torch::Library::_def(std::variant<c10::OperatorName, c10::FunctionSchema>&&, int)")
        == "torch::Library::_def"
    )
    assert abi.short_name("c10::foo<void (int)>(int)") == "c10::foo<void (int)>"
    assert abi.short_name("c10::Functor::operator()(int) const") == "c10::Functor::operator()"


# ------------------------------------------------------------------------------------------------ readers


def test_no_reader_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "elftools", None)  # import elftools -> ImportError
    monkeypatch.setitem(sys.modules, "elftools.elf.elffile", None)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(AbiUnavailable) as err:
        make_reader()
    assert "\n" not in str(err.value) and "pyelftools" in str(err.value) and "readelf" in str(err.value)


def test_readers_agree_on_a_real_extension(elf):
    try:
        py, re_ = make_reader("pyelftools"), make_reader("readelf")
    except AbiUnavailable:
        pytest.skip("needs both pyelftools and readelf")
    for path in (elf["ext"], elf["ext_versioned"], elf["ext_cuda"]):
        assert py.dynamic(path) == re_.dynamic(path)
        assert sorted(map(repr, py.undefined(path))) == sorted(map(repr, re_.undefined(path)))


def test_quick_needed_scan_agrees_with_the_readers(elf, reader, tmp_path):
    """elf.needed (the discovery's struct scan) == the full reader's DT_NEEDED, on every fixture and on the
    interpreter; a file that is not ELF (a linker script), a truncated one and a 32-bit one are handled."""
    files = [p for p in elf["root"].rglob("*.so*")] + [Path(sys.executable).resolve()]
    for path in files:
        assert needed(path) == reader.dynamic(path).needed, path
    assert "libtorch_cpu.so" in needed(elf["ext"]) and "libc10_cuda.so" in needed(elf["ext"])
    script = tmp_path / "libfoo.so"
    script.write_text("/* GNU ld script */\nGROUP ( libfoo.so.1 )\n")
    cut = tmp_path / "cut.so"
    cut.write_bytes(elf["ext"].read_bytes()[:80])
    for bad in (script, cut):
        with pytest.raises(ValueError):
            needed(bad)
    if (
        subprocess.run(
            [GXX, "-m32", "-shared", "-x", "c++", "-", "-o", str(tmp_path / "m32.so"), f"-L{elf['old']}"],
            input="int f() { return 1; }",
            capture_output=True,
            text=True,
        ).returncode
        == 0
    ):
        assert needed(tmp_path / "m32.so") == reader.dynamic(tmp_path / "m32.so").needed


# ------------------------------------------------------------------------------------------------ installed env


def _dist(site: Path, name: str, version: str, files: dict[str, Path | str], requires=()) -> None:
    """A minimal installed distribution: METADATA, RECORD, and its files copied (or written) into ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    for rel, content in files.items():
        dest = site / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, dest)
        else:
            dest.write_text(content)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/METADATA,,\n")


def _site(root: Path, elf, torch_folder: Path, torch_version: str, cuda: str | None) -> Path:
    site = root / f"site-{torch_version}"
    _dist(
        site,
        "torch",
        torch_version,
        {
            "torch/__init__.py": "",
            "torch/version.py": f"from typing import Optional\n__version__ = '{torch_version}'\ncuda: Optional[str] = {cuda!r}\n",
            **{f"torch/lib/{p.name}": p for p in torch_folder.glob("*.so")},
        },
    )
    _dist(site, "sglang", "0.5.17", {"sglang/__init__.py": ""}, requires=["fake-kernel", "torch"])
    _dist(
        site,
        "fake-kernel",
        "1.0",
        {
            "fake_kernel/__init__.py": "",
            "fake_kernel/sm90/ops.abi3.so": elf["ext"],
            "fake_kernel/ops_cuda.so": elf["ext_cuda"],
            # built for torch 2.6 only: its package never loads it under this torch, so it is not checked
            "fake_kernel/addon_torch26-cpu.so": elf["ext"],
        },
        requires=["torch", 'not-installed; python_version < "3"'],
    )
    _dist(site, "unrelated", "1.0", {"unrelated/ops.so": elf["ext"]})  # not a dependency of sglang
    return site


def test_installed_environment_pins_pass(elf, reader, tmp_path):
    site = _site(tmp_path, elf, elf["old"], "2.11.0", "12.8")
    rep = abi.check_installed(reader, path=[str(site)])
    assert [r.label for r in rep.libraries] == ["fake_kernel/sm90/ops.abi3.so", "fake_kernel/ops_cuda.so"]
    assert rep.distributions == ["fake-kernel 1.0"]
    assert rep.torch_version == "2.11.0" and rep.torch_cuda == "12.8"
    assert rep.failure_message() is None
    assert abi.cuda_mismatches(rep.libraries, rep.torch_cuda) == []


def test_installed_environment_override_fails(elf, reader, tmp_path):
    site = _site(tmp_path, elf, elf["new"], "2.13.0", "13.0")
    rep = abi.check_installed(reader, path=[str(site)])
    assert [r.label for r in rep.broken] == ["fake_kernel/sm90/ops.abi3.so", "fake_kernel/ops_cuda.so"]
    head = rep.failure_message().splitlines()[0]
    assert head.startswith("torch 2.13.0 does not define 2 symbol(s) that 2 native libraries need: ")
    assert head.endswith(
        "-- needed by fake_kernel/sm90/ops.abi3.so (2), fake_kernel/ops_cuda.so (2); "
        "torch 2.13.0 ships no libc10_cuda.so -- needed by fake_kernel/sm90/ops.abi3.so"
    )
    assert abi.cuda_mismatches(rep.libraries, rep.torch_cuda) == [
        "fake_kernel/ops_cuda.so needs libcudart.so.12 (CUDA 12)"
    ]


def test_cpu_torch_has_no_cuda_version(elf, reader, tmp_path):
    site = _site(tmp_path, elf, elf["old"], "2.11.0", None)
    assert abi.check_installed(reader, path=[str(site)]).torch_cuda is None


def test_missing_torch_or_root_is_one_line(tmp_path):
    site = tmp_path / "empty"
    site.mkdir()
    with pytest.raises(abi.AbiUnavailable, match="^torch is not installed"):
        abi.check_installed(path=[str(site)])
    _dist(site, "torch", "2.11.0", {"torch/__init__.py": ""})
    with pytest.raises(abi.AbiUnavailable, match="^sglang is not installed"):
        abi.check_installed(path=[str(site)])


def test_no_torch_linked_library_fails_instead_of_passing(elf, reader, tmp_path):
    """sglang's kernels link torch on every release: finding none means nothing was checked against this torch
    (kernels not installed, or unreadable), which must fail the check, never skip it."""
    site = tmp_path / "site"
    _dist(
        site,
        "torch",
        "2.11.0",
        {"torch/__init__.py": "", **{f"torch/lib/{p.name}": p for p in elf["old"].glob("*.so")}},
    )
    _dist(site, "sglang", "0.5.17", {"sglang/__init__.py": "", "sglang/not_elf.so": "INPUT(-lc)\n"}, requires=["torch"])
    rep = abi.check_installed(reader, path=[str(site)])
    assert rep.libraries == []
    message = rep.failure_message()
    assert message == (
        "no native library of sglang or its dependencies links torch (1 shared object(s) seen in "
        "1 distribution(s), none linking it): sglang's kernels (sgl_kernel) do on every release, so "
        "nothing was checked against torch 2.11.0"
    )
