"""mypy plugin (pyproject.toml's [tool.mypy] plugins): reading a record's field with ``.get("name")`` where the
record's type (mtpmatrix.core.record_types) has no field ``name`` is an error.

The typing spec lets ``TypedDict.get`` take any key (an unknown one just returns ``object``), and the readers of the
results records use ``.get`` almost everywhere, since any field of a record on disk may be absent: without this a
misspelt field -- ``record.get("verdcit")`` -- type-checks and reads None forever. ``record["verdcit"]`` is mypy's
own error already.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.errorcodes import TYPEDDICT_ITEM
from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType, get_proper_type

GET = "typing.Mapping.get"  # how mypy names TypedDict.get (its default plugin hooks the same name)


def _get(ctx: MethodContext) -> Type:
    record = get_proper_type(ctx.type)
    if isinstance(record, TypedDictType) and ctx.args and ctx.args[0]:
        for key in try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or []:
            if key not in record.items:
                name = record.fallback.type.name if record.fallback.type.name != "TypedDict" else "the record"
                ctx.api.fail(f'TypedDict "{name}" has no key "{key}"', ctx.context, code=TYPEDDICT_ITEM)
    return typed_dict_get_callback(ctx)  # the default plugin's return type: this hook runs instead of its own


class RecordKeys(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return _get if fullname == GET else None


def plugin(version: str) -> type[Plugin]:
    return RecordKeys
