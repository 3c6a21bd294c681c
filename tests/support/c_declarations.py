"""What a C file declares to its callers, read from its text: typedef'd structs, enum constants and the prototypes of
functions that are not static. Enough C for tally/native (no function-pointer fields or parameters, no bit fields);
text it cannot read raises ValueError rather than being guessed at."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "extern", "inline"}
# comments and string / character literals, matched left to right so that neither hides inside the other
_COMMENT_OR_LITERAL = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_PREPROCESSOR = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)  # with its backslash-continued lines
_STRUCT = re.compile(r"typedef\s+struct\s*\w*\s*\{(?P<body>[^{}]*)\}\s*(?P<name>\w+)\s*;", re.S)
_ENUM = re.compile(r"enum\s*\w*\s*\{(?P<body>[^{}]*)\}\s*;", re.S)
_TOKENS = re.compile(r"\w+|\*|\[[^\]]*\]")
_FUNCTION = re.compile(r"(?P<result>[\w\s*]*?[\w*])\s*\b(?P<name>\w+)\s*\((?P<params>[^()]*)\)\s*[{;]", re.S)


@dataclass(frozen=True)
class CType:
    base: str  # int64_t, float, void, a struct's typedef name
    pointers: int = 0
    length: int | None = None  # an array's element count

    def __str__(self) -> str:
        stars = " " + "*" * self.pointers if self.pointers else ""
        return self.base + stars + ("" if self.length is None else f"[{self.length}]")


@dataclass(frozen=True)
class Struct:
    name: str
    body: str
    text: str  # the typedef as C, comments removed: what a layout probe compiles

    @property
    def fields(self) -> tuple[tuple[str, CType], ...]:
        """Read when asked: a struct no mirror copies may hold what this reader does not know."""
        return tuple(pair for decl in self.body.split(";") if decl.strip() for pair in _declarators(decl))


@dataclass(frozen=True)
class Function:
    name: str
    result: CType
    params: tuple[CType, ...]


@dataclass
class Declarations:
    structs: dict[str, Struct] = field(default_factory=dict)  # in the order of the files' text
    enums: dict[str, int | None] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)  # the ones that are not static


def read(paths: list[Path]) -> Declarations:
    """The declarations of the files `paths`, in their order; each file must hold whole top-level statements."""
    found = Declarations()
    for path in paths:
        for statement in _statements(_code(path.read_text())):
            _read_statement(statement, found, path)
    return found


def _code(text: str) -> str:
    """The text without comments, literals' contents or preprocessor lines."""
    text = _COMMENT_OR_LITERAL.sub(lambda m: " " if m.group().startswith("/") else '""', text)
    return _PREPROCESSOR.sub("", text)


def _statements(code: str) -> list[str]:
    """The top-level declarations and definitions, each whole: a function's ends at its body's closing brace, any
    other's at its semicolon."""
    out, start, depth = [], 0, 0
    for i, ch in enumerate(code):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"a closing brace without its opening one: {code[max(0, i - 80):i + 1]!r}")
            if depth == 0 and _is_function(code[start:i].split("{", 1)[0]):
                out.append(code[start:i + 1].strip())
                start = i + 1
        elif ch == ";" and depth == 0:
            out.append(code[start:i + 1].strip())
            start = i + 1
    if depth or code[start:].strip():
        raise ValueError(f"text after the last whole statement: {code[start:start + 80]!r}")
    return out


def _is_function(head: str) -> bool:
    """Whether the text before a top-level brace opens a function's body, not a struct's, an enum's or a value's."""
    return re.search(r"\)\s*$", head) is not None and "=" not in head


def _read_statement(statement: str, found: Declarations, path: Path) -> None:
    if m := _STRUCT.fullmatch(statement):
        found.structs[m["name"]] = Struct(m["name"], m["body"], statement)
    elif m := _ENUM.fullmatch(statement):
        value: int | None = -1
        for item in filter(str.strip, m["body"].split(",")):
            name, _, given = (part.strip() for part in item.partition("="))
            if given:  # a literal, or an expression this reader leaves unread
                value = int(given, 0) if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", given) else None
            else:
                value = None if value is None else value + 1
            found.enums[name] = value
    elif (m := _FUNCTION.match(statement)) and not re.search(r"\b(static|typedef)\b", m["result"]):
        params = [] if m["params"].strip() in ("", "void") else m["params"].split(",")
        fn = Function(m["name"], _declarators(m["result"] + " " + m["name"])[0][1],
                      tuple(_declarators(p)[0][1] for p in params))
        if found.functions.setdefault(fn.name, fn) != fn:
            raise ValueError(f"{path.name} declares {fn.name} twice, differently")


def _declarators(decl: str) -> list[tuple[str, CType]]:
    """`const void *scale, *min` → [("scale", void *), ("min", void *)]; `float tail[8]` → [("tail", float[8])]."""
    parts = [[t for t in _TOKENS.findall(part) if t not in _QUALIFIERS] for part in decl.split(",")]
    words = [t for t in parts[0] if t[0] not in "*["]
    if len(words) < 2 or re.search(r"[():]", decl):
        raise ValueError(f"cannot read the declaration {decl.strip()!r}")
    out = []
    for tokens in parts:
        lengths = [t[1:-1].strip() for t in tokens if t[0] == "["]
        names = [t for t in tokens if t[0] not in "*["]
        if len(lengths) > 1 or not names or not all(n.isdigit() for n in lengths):
            raise ValueError(f"cannot read the declaration {decl.strip()!r}")
        out.append((names[-1], CType(" ".join(words[:-1]), tokens.count("*"), int(lengths[0]) if lengths else None)))
    return out
