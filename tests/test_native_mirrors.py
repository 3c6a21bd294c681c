"""The Python copies of tally/native's C declarations match the C text (read by tests/support/c_declarations.py):
the decode step's ctypes structs, library.py's argument and result types, the enum constants. ctypes cannot see a
mismatch: the kernels would read the wrong bytes."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from support.c_declarations import CType, Struct, read
from tally import LLM
from tally.models import native_decode_step, native_experts
from tally.native import library, lora_delta, ops

C = read([*library.HEADERS, library.SOURCE])  # in inclusion order: each struct after those it holds
MIRRORS = {cls.__name__.lstrip("_"): cls for module in (native_decode_step, native_experts, lora_delta)
           for cls in vars(module).values()
           if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls.__module__ == module.__name__}
SCALARS = {"int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16,
           "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
           "uint64_t": ctypes.c_uint64, "int": ctypes.c_int, "size_t": ctypes.c_size_t, "float": ctypes.c_float,
           "double": ctypes.c_double}


def holds(py: object, c: CType, mirrors: dict[str, type]) -> bool:
    """Whether the ctypes type `py` passes or holds what C declares `c`: a pointer as c_void_p or as a POINTER to
    its pointee's mirror, a struct as its mirror, an array as an array as long, void as None."""
    if c.length is not None:
        return (isinstance(py, type) and issubclass(py, ctypes.Array) and py._length_ == c.length
                and holds(py._type_, CType(c.base, c.pointers), mirrors))
    if c.pointers:
        return py is ctypes.c_void_p or (isinstance(py, type) and issubclass(py, ctypes._Pointer)
                                         and holds(py._type_, CType(c.base, c.pointers - 1), mirrors))
    if c.base == "void":
        return py is None
    expected = mirrors.get(c.base, SCALARS.get(c.base))
    return expected is not None and py is expected


def struct_mismatches(c: Struct, mirror: type[ctypes.Structure], mirrors: dict[str, type]) -> list[str]:
    c_names, py_names = [name for name, _ in c.fields], [name for name, *_ in mirror._fields_]
    if c_names != py_names:
        return [f"{mirror.__name__}'s fields {py_names} are not {c.name}'s {c_names}"]
    return [f"{mirror.__name__}.{name} is {py.__name__}; {c.name}.{name} is {c_type}"
            for (name, c_type), (_, py, *_) in zip(c.fields, mirror._fields_) if not holds(py, c_type, mirrors)]


def signature_mismatches(argtypes: dict[str, list], restypes: dict[str, object],
                         mirrors: dict[str, type]) -> list[str]:
    """`argtypes` as library.SIGNATURES against C's functions named tally_*; `restypes` as library.RESULTS (a function
    it leaves out returns void)."""
    exported = {name: fn for name, fn in C.functions.items() if name.startswith("tally_")}
    found = [f"{name} is declared in {'C' if name in exported else 'Python'} only"
             for name in sorted(set(exported) ^ set(argtypes))]
    for name in sorted(set(exported) & set(argtypes)):
        fn, args = exported[name], argtypes[name]
        if len(args) != len(fn.params):
            found.append(f"{name} takes {len(fn.params)} arguments in C, {len(args)} in Python")
        found += [f"{name}'s argument {i} is {getattr(py, '__name__', py)}; C's is {c}"
                  for i, (c, py) in enumerate(zip(fn.params, args)) if not holds(py, c, mirrors)]
        if not holds(restypes.get(name), fn.result, mirrors):
            found.append(f"{name} returns {fn.result} in C, {getattr(restypes.get(name), '__name__', None)} in Python")
    return found


def test_every_struct_mirror_has_its_c_fields_in_order_and_type():
    assert {"Proj", "Layer", "Model"} <= set(MIRRORS)
    for name, mirror in MIRRORS.items():
        assert name in C.structs, f"{mirror.__name__} mirrors no C struct {name}"
        assert struct_mismatches(C.structs[name], mirror, MIRRORS) == []


def test_every_exported_function_has_its_c_signature():
    assert signature_mismatches(library.SIGNATURES, library.RESULTS, MIRRORS) == []


def test_enum_constants_have_their_c_values():
    c_proj = {name: value for name, value in C.enums.items() if name.startswith("PROJ_")}
    assert c_proj and {name: getattr(native_decode_step, name) for name in c_proj} == c_proj
    py_kv = {"KV_F32": ops.KV_KINDS[torch.float32], "KV_I8": ops.KV_INT8, "KV_F16": ops.KV_KINDS[torch.float16],
             "KV_BF16": ops.KV_KINDS[torch.bfloat16]}
    assert {name: value for name, value in C.enums.items() if name.startswith("KV_")} == py_kv
    routes = {f"ROUTE_{name.upper()}": value for name, value in native_experts.ROUTINGS.items()}
    assert {name: value for name, value in C.enums.items() if name.startswith("ROUTE_")} == routes
    acts = {f"ACT_{name.upper()}": value for name, value in ops.ACTIVATIONS.items()}
    assert {name: value for name, value in C.enums.items() if name.startswith("ACT_")} == acts


def test_struct_mirrors_have_the_compilers_layout(tmp_path: Path):
    """Sizes and field offsets as the C compiler lays the structs out, against ctypes'."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc) on PATH")
    structs = [s for s in C.structs.values() if s.name in MIRRORS]  # in the source's order: each after its parts
    prints = [f'printf("{s.name} %zu\\n", sizeof({s.name}));' for s in structs]
    prints += [f'printf("{s.name}.{f} %zu\\n", offsetof({s.name}, {f}));' for s in structs for f, _ in s.fields]
    probe = tmp_path / "layout.c"
    probe.write_text("#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n"
                     + "\n".join(s.text for s in structs) + "\nint main(void) {\n" + "\n".join(prints) + "\n}\n")
    subprocess.run([compiler, "-o", str(tmp_path / "layout"), str(probe)], check=True)
    printed = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout
    c_layout = {key: int(value) for key, value in (line.split() for line in printed.splitlines())}
    py_layout = {s.name: ctypes.sizeof(MIRRORS[s.name]) for s in structs}
    py_layout |= {f"{s.name}.{f}": getattr(MIRRORS[s.name], f).offset for s in structs for f, *_ in
                  MIRRORS[s.name]._fields_}
    assert py_layout == c_layout


class _SwappedProj(ctypes.Structure):
    _fields_ = [(name, t) for name, t in native_decode_step._Proj._fields_]
    _fields_[1], _fields_[2] = _fields_[2], _fields_[1]


class _NarrowProj(ctypes.Structure):  # int for an int64_t
    _fields_ = [(name, ctypes.c_int if name == "bits" else t) for name, t in native_decode_step._Proj._fields_]


class _ShortLayer(ctypes.Structure):  # the last field left out
    _fields_ = native_decode_step._Layer._fields_[:-1]


@pytest.mark.parametrize("name, mirror", [("Proj", _SwappedProj), ("Proj", _NarrowProj), ("Layer", _ShortLayer)])
def test_a_wrong_struct_mirror_is_caught(name, mirror):
    assert struct_mismatches(C.structs[name], mirror, MIRRORS)


def test_a_wrong_signature_is_caught():
    def broken(name: str, args: list) -> list[str]:
        return signature_mismatches({**library.SIGNATURES, name: args}, library.RESULTS, MIRRORS)

    rms_norm = library.SIGNATURES["tally_rms_norm"]  # (x, w, y, M, D, eps)
    assert broken("tally_rms_norm", rms_norm[:-1]) == ["tally_rms_norm takes 6 arguments in C, 5 in Python"]
    assert broken("tally_rms_norm", [*rms_norm[:3], rms_norm[5], rms_norm[4], rms_norm[3]])  # eps and M swapped
    assert broken("tally_made_up", []) == ["tally_made_up is declared in Python only"]
    assert signature_mismatches(library.SIGNATURES, {**library.RESULTS, "tally_rms_norm": ctypes.c_int64}, MIRRORS)


def test_the_step_reads_only_what_the_model_has(tiny_llama: Path):
    """The step's protocols (StepModel, StepLayer) name attributes the loaded model and its layers have."""
    model = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=2_000_000).engine.model
    assert [name for name in native_decode_step.StepModel.__annotations__ if not hasattr(model, name)] == []
    assert [name for name in native_decode_step.StepLayer.__annotations__ if not hasattr(model.layers[0], name)] == []


def test_the_reader_skips_comments_literals_and_macros(tmp_path: Path):
    source = tmp_path / "tricky.c"
    source.write_text('#define WRAP(x) { x; }\n/* } */ typedef struct { int64_t n; /* { */ const float *a, *b;\n'
                      'char tag[4]; } Tricky;\nstatic int helper(void) { return \'}\' + sizeof("{"); }\n'
                      'int64_t tally_tricky(const Tricky *t, int n) { return helper(); }\nenum { A = 1, B, C = 0x10 };\n')
    found = read([source])
    assert [(name, str(c)) for name, c in found.structs["Tricky"].fields] == [
        ("n", "int64_t"), ("a", "float *"), ("b", "float *"), ("tag", "char[4]")]
    assert list(found.functions) == ["tally_tricky"]
    assert [str(c) for c in found.functions["tally_tricky"].params] == ["Tricky *", "int"]
    assert found.enums == {"A": 1, "B": 2, "C": 16}


def _defined(name: str) -> int:
    """The integer a plain `#define NAME expr` of the C sources sets (casts dropped, the rest evaluated)."""
    for path in (library.SOURCE, *library.HEADERS):
        found = re.search(rf"(?m)^#define {name}\s+(.+?)\s*(?:/[*/].*)?$", Path(path).read_text())
        if found:
            return int(eval(re.sub(r"\((?:u?int\d+_t|int|size_t)\)", "", found.group(1)), {}))  # noqa: S307
    raise AssertionError(f"#define {name} is in no C source")


@pytest.mark.parametrize("name", ["TILE", "PANEL", "READ_CHUNK"])
def test_ops_constants_are_the_c_defines(name):
    assert getattr(ops, name) == _defined(name)
