"""A pickle walk that never unpickles: the storages a PyTorch pickle names.

A pickle is followed opcode by opcode on a small symbolic stack that only
knows strings, numbers, tuples, lists, class names and persistent ids; every
other value is OPAQUE. What it records (a Walk): each storage's persistent id
('storage', class, key, location, numel), each _rebuild_tensor_v2 view of a
storage (offset, size, stride), and the first dict key a tensor is stored
under (the state-dict name).

The opcodes PyTorch pickles are made of are decoded straight from the bytes
(_Machine.run), about three times quicker than pickletools.genops; genops
decodes the rest, and walk(fast=False) walks with genops alone, the
reference the fast path is tested against.
"""

from __future__ import annotations

import io
import pickletools
import struct
from dataclasses import dataclass, field

from . import ParseError

# These records are built once per tensor or storage: slotted dataclasses, as frozen
# ones take three times as long to build (zip_reader.Member likewise).


class _Opaque:
    """A value the walker does not follow (dicts, objects, results of calls)."""


OPAQUE = _Opaque()
MARK = object()


@dataclass(slots=True)
class Global:
    name: str  # "module qualname", as GLOBAL spells it


@dataclass(slots=True)
class StorageRef:
    key: str
    cls: str
    numel: int


@dataclass(slots=True)
class TensorRef:
    key: str  # the storage it views


@dataclass
class Walk:
    """What one pickle says about its storages, and where it ends."""

    storages: dict[str, StorageRef] = field(default_factory=dict)
    conflicts: set[str] = field(default_factory=set)
    views: dict[str, list[tuple]] = field(default_factory=dict)  # key -> [(offset, size, stride)]
    names: dict[str, str] = field(default_factory=dict)  # storage key -> first state-dict key naming it
    result: object = OPAQUE
    end: int = 0  # offset just after STOP

    def add(self, ref: StorageRef) -> None:
        old = self.storages.setdefault(ref.key, ref)
        if old != ref:
            self.conflicts.add(ref.key)


STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
           "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}
_NUMBERS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_REBUILDERS = {"torch._utils _rebuild_tensor_v2", "torch._utils _rebuild_tensor"}
_U16, _I32, _U32 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I")


class _Machine:
    """The symbolic stack, memo and findings of one pickle walk."""

    def __init__(self):
        self.w = Walk()
        self.stack: list = []
        self.memo: dict[int, object] = {}

    def pop(self):
        stack = self.stack
        if not stack or stack[-1] is MARK:
            raise ParseError("pickle stack underflow")
        return stack.pop()

    def pop_mark(self) -> list:
        stack = self.stack
        items = []
        while True:
            if not stack:
                raise ParseError("pickle MARK missing")
            v = stack.pop()
            if v is MARK:
                return items[::-1]
            items.append(v)

    def step(self, op: pickletools.OpcodeInfo, arg, pos: int) -> bool:
        """Apply one opcode as genops decoded it; True at STOP."""
        w, stack, memo, pop, pop_mark = self.w, self.stack, self.memo, self.pop, self.pop_mark
        name = op.name
        if name in STRINGS:
            stack.append(arg)
        elif name in _NUMBERS:
            stack.append(arg)
        elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
            stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
        elif name == "MARK":
            stack.append(MARK)
        elif name == "GLOBAL":
            stack.append(Global(arg))
        elif name == "STACK_GLOBAL":
            qual, module = pop(), pop()
            ok = isinstance(qual, str) and isinstance(module, str)
            stack.append(Global(f"{module} {qual}") if ok else OPAQUE)
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = [pop() for _ in range(n)][::-1]
            stack.append(tuple(items))
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "LIST":
            stack.append(pop_mark())
        elif name == "APPEND":
            v = pop()
            if stack and isinstance(stack[-1], list):
                stack[-1].append(v)
        elif name == "APPENDS":
            items = pop_mark()
            if stack and isinstance(stack[-1], list):
                stack[-1].extend(items)
        elif name in PUTS:
            if not stack or stack[-1] is MARK:
                raise ParseError("pickle memoizes nothing")
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            if not stack or stack[-1] is MARK:
                raise ParseError("pickle memoizes nothing")
            memo[len(memo)] = stack[-1]
        elif name in _GETS:
            if arg not in memo:
                raise ParseError("pickle reads an unset memo slot")
            stack.append(memo[arg])
        elif name == "BINPERSID":
            stack.append(_persistent(w, pop()))
        elif name == "REDUCE":
            args, fn = pop(), pop()
            if isinstance(fn, Global) and fn.name in _REBUILDERS:
                stack.append(_rebuilt(w, args))
            else:
                stack.append(OPAQUE)
        elif name in ("SETITEM", "SETITEMS"):
            # dict[key] = tensor: the key names the tensor's storage.
            items = [pop(), pop()][::-1] if name == "SETITEM" else pop_mark()
            pop()  # the dict
            for key, value in zip(items[::2], items[1::2]):
                if isinstance(key, str) and isinstance(value, TensorRef):
                    w.names.setdefault(value.key, key)
            stack.append(OPAQUE)
        elif name == "STOP":
            w.result = pop()
            w.end = pos + 1
            return True
        else:  # everything else only by its stack effect
            before = op.stack_before
            if pickletools.markobject in before:
                pop_mark()
                for _ in range(before.index(pickletools.markobject)):
                    pop()
            else:
                for _ in before:
                    pop()
            stack.extend(OPAQUE for _ in op.stack_after)
        return False

    def run(self, data: bytes, i: int) -> int:
        """Apply the opcodes that PyTorch pickles are made of, decoded straight from the
        bytes, from data[i] on; returns the index of the first opcode left to step():
        STOP, a rarer opcode, or one that is cut off or would raise (whose effect is then
        step()'s, error included). Each branch is step() for that opcode, checked before
        it changes anything."""
        w, stack, memo = self.w, self.stack, self.memo
        push = stack.append
        u16, i32, u32 = _U16.unpack_from, _I32.unpack_from, _U32.unpack_from
        n = len(data)
        while i < n:
            c = data[i]
            if c == 0x72:  # LONG_BINPUT
                if i + 5 > n or not stack or stack[-1] is MARK:
                    break
                memo[u32(data, i + 1)[0]] = stack[-1]
                i += 5
            elif c == 0x68:  # BINGET
                if i + 2 > n or data[i + 1] not in memo:
                    break
                push(memo[data[i + 1]])
                i += 2
            elif c == 0x4B:  # BININT1
                if i + 2 > n:
                    break
                push(data[i + 1])
                i += 2
            elif c == 0x58:  # BINUNICODE
                if i + 5 > n:
                    break
                end = i + 5 + u32(data, i + 1)[0]
                if end > n:
                    break
                try:
                    push(str(data[i + 5:end], "utf-8", "surrogatepass"))
                except UnicodeDecodeError:
                    break
                i = end
            elif c == 0x28:  # MARK
                push(MARK)
                i += 1
            elif c == 0x74:  # TUPLE
                k = _last_mark(stack)
                if k < 0:
                    break
                items = tuple(stack[k + 1:])
                del stack[k:]
                push(items)
                i += 1
            elif c == 0x52:  # REDUCE
                if len(stack) < 2 or stack[-1] is MARK or stack[-2] is MARK:
                    break
                args = stack.pop()
                fn = stack.pop()
                if isinstance(fn, Global) and fn.name in _REBUILDERS:
                    push(_rebuilt(w, args))
                else:
                    push(OPAQUE)
                i += 1
            elif c == 0x71:  # BINPUT
                if i + 2 > n or not stack or stack[-1] is MARK:
                    break
                memo[data[i + 1]] = stack[-1]
                i += 2
            elif c == 0x4D:  # BININT2
                if i + 3 > n:
                    break
                push(u16(data, i + 1)[0])
                i += 3
            elif c == 0x29:  # EMPTY_TUPLE
                push(())
                i += 1
            elif c == 0x85:  # TUPLE1
                if not stack or stack[-1] is MARK:
                    break
                stack[-1] = (stack[-1],)
                i += 1
            elif c == 0x89:  # NEWFALSE
                push(False)
                i += 1
            elif c == 0x51:  # BINPERSID
                if not stack or stack[-1] is MARK:
                    break
                stack[-1] = _persistent(w, stack[-1])
                i += 1
            elif c == 0x7D:  # EMPTY_DICT
                push(OPAQUE)
                i += 1
            elif c == 0x73:  # SETITEM
                if len(stack) < 3 or stack[-1] is MARK or stack[-2] is MARK or stack[-3] is MARK:
                    break
                value = stack.pop()
                key = stack.pop()
                if isinstance(key, str) and isinstance(value, TensorRef):
                    w.names.setdefault(value.key, key)
                stack[-1] = OPAQUE
                i += 1
            elif c == 0x6A:  # LONG_BINGET
                if i + 5 > n or u32(data, i + 1)[0] not in memo:
                    break
                push(memo[u32(data, i + 1)[0]])
                i += 5
            elif c == 0x86:  # TUPLE2
                if len(stack) < 2 or stack[-1] is MARK or stack[-2] is MARK:
                    break
                b = stack.pop()
                stack[-1] = (stack[-1], b)
                i += 1
            elif c == 0x4A:  # BININT
                if i + 5 > n:
                    break
                push(i32(data, i + 1)[0])
                i += 5
            elif c == 0x4E:  # NONE
                push(None)
                i += 1
            elif c == 0x88:  # NEWTRUE
                push(True)
                i += 1
            else:
                break
        return i


def _last_mark(stack: list) -> int:
    """The index of the topmost MARK on the stack; -1 if there is none."""
    k = len(stack) - 1
    while k >= 0 and stack[k] is not MARK:
        k -= 1
    return k


def walk(data: bytes, start: int = 0, fast: bool = True) -> Walk:
    """Follow one pickle that begins at data[start]; raises ParseError if malformed.

    `fast` decodes the common opcodes in _Machine.run, about three times quicker than genops,
    with the same result; fast=False walks with genops alone (the reference, for tests).
    """
    m = _Machine()
    stream = io.BytesIO(data)
    stream.seek(start)
    if not fast:
        for op, arg, pos in pickletools.genops(stream):
            if m.step(op, arg, pos):
                return m.w
        raise ParseError("pickle has no STOP")
    i = start
    while True:
        i = m.run(data, i)
        stream.seek(i)
        # genops raises ValueError itself where the pickle is cut or the opcode unknown
        op, arg, pos = next(pickletools.genops(stream))
        if m.step(op, arg, pos):
            return m.w
        i = stream.tell()


def _persistent(w: Walk, pid) -> object:
    # ('storage', StorageClass, key, location, numel[, view_metadata])
    if (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
            and isinstance(pid[1], Global) and isinstance(pid[2], str)
            and isinstance(pid[4], int) and not isinstance(pid[4], bool) and pid[4] >= 0):
        ref = StorageRef(pid[2], pid[1].name, pid[4])
        w.add(ref)
        return ref
    return OPAQUE


def _rebuilt(w: Walk, args) -> object:
    # _rebuild_tensor_v2(storage, storage_offset, size, stride, ...)
    if not (isinstance(args, tuple) and len(args) >= 4 and isinstance(args[0], StorageRef)):
        return OPAQUE
    ref, offset, size, stride = args[:4]
    w.views.setdefault(ref.key, []).append((offset, size, stride))
    return TensorRef(ref.key)
