"""A kernel's config: one perf config per tuned dispatch, as one string.

`"default"` is the compiler's own choice everywhere; otherwise the string is
`<dispatch>=<perf config>` entries joined by `;`, ordered by dispatch index,
e.g. `0=cpu:v1:64x64x0,8x32x0,0x0x4;1=cpu:v1:32x0,8x0,0x32`. A dispatch not
listed keeps the compiler's default. Module options (`jit.finalize.MODULE_OPTIONS`,
e.g. `O2`, `data-tiling`) come first, in that table's order: `O2;data-tiling;3=cpu:v1:...`
(dispatch indices then count the dispatches of the module compiled with them).
This string is part of native-code cache keys and of the per-kernel selection
the loader reads.
"""

from __future__ import annotations

from dataclasses import field
from typing import Iterator, Mapping

from portkern.base.errors import PerfConfigError
from portkern.base.records import frozen_record
from portkern.jit.finalize import MODULE_OPTIONS, module_options
from portkern.tuner import perfconfig, registry
from portkern.tuner.perfconfig import PerfConfig

DEFAULT = "default"
#: Most dispatches a kernel config may name.
MAX_DISPATCHES = 256


@frozen_record
class KernelConfig:
    """Perf configs by dispatch index; dispatches not present keep the default."""

    dispatches: tuple[tuple[int, PerfConfig], ...] = field(default_factory=tuple)
    #: Module options (names in `jit.finalize.MODULE_OPTIONS`, in its order).
    options: tuple[str, ...] = ()

    @classmethod
    def of(cls, configs: Mapping[int, PerfConfig], options: tuple[str, ...] = ()) -> "KernelConfig":
        return cls(tuple(sorted(configs.items())), tuple(o for o in MODULE_OPTIONS if o in options))

    @property
    def is_default(self) -> bool:
        return not self.dispatches and not self.options

    def get(self, index: int) -> PerfConfig | None:
        return dict(self.dispatches).get(index)

    def with_dispatch(self, index: int, config: PerfConfig | None) -> "KernelConfig":
        """This config with one dispatch replaced (None: back to its default)."""
        configs = dict(self.dispatches)
        configs.pop(index, None)
        if config is not None:
            configs[index] = config
        return KernelConfig.of(configs, self.options)

    def __iter__(self) -> Iterator[tuple[int, PerfConfig]]:
        return iter(self.dispatches)

    def __str__(self) -> str:
        if self.is_default:
            return DEFAULT
        return ";".join([*self.options, *(f"{index}={perfconfig.to_string(config)}" for index, config in self.dispatches)])


def parse(text: str) -> KernelConfig:
    """The kernel config a string names ("default" or `i=<perf config>;...`)."""
    if not isinstance(text, str) or len(text) > perfconfig.MAX_CONFIG_CHARS * 4:
        raise PerfConfigError("a kernel config must be a string of reasonable length")
    if text == DEFAULT:
        return KernelConfig()
    configs: dict[int, PerfConfig] = {}
    options = module_options(text)
    entries = text.split(";")[len(options):]
    if len(entries) > MAX_DISPATCHES:
        raise PerfConfigError(f"kernel config names more than {MAX_DISPATCHES} dispatches")
    for entry in entries:
        index, sep, body = entry.partition("=")
        if not sep or not index.isdigit() or (len(index) > 1 and index[0] == "0") or int(index) >= MAX_DISPATCHES:
            raise PerfConfigError(f"kernel config entry {entry!r} is not <dispatch index>=<perf config>")
        if int(index) in configs:
            raise PerfConfigError(f"kernel config {text!r} names dispatch {index} twice")
        configs[int(index)] = registry.parse(body)
    config = KernelConfig.of(configs, options)
    if str(config) != text:
        raise PerfConfigError(f"kernel config {text!r} is not in canonical form (module options first, once each, "
                              f"then dispatches in increasing order): {config}")
    return config
