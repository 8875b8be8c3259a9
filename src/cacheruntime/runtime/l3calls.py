"""`LocalGPURuntime`'s L3 calls: its options, `l3_exists`, and the store's side of `probe()` (§9).

Persist and Fetch need nothing here: they are intents, applied by the ledger (`ledger/l3.py`)
and moved by the device layer (`device/l3moves.py`) as Backup and Restore are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from cacheruntime.protocol import HostMode, NoL3
from cacheruntime.runtime.ledger.arguments import keys_argument
from cacheruntime.runtime.ledger.transaction import operation
from cacheruntime.storage.spec import open_store
from cacheruntime.storage.store import Store

if TYPE_CHECKING:
    from cacheruntime.runtime.device.layer import DeviceLayer
    from cacheruntime.runtime.ledger import Ledger


#: What `LocalGPURuntime(l3=...)` takes: a store, a spec string (`file:DIR`), or None (no L3).
L3Spec = Store | str | None


def l3_options(host_mode: HostMode | str, l3: L3Spec, l2_pages: int) -> tuple[HostMode, Store | None]:
    """The host mode and the store a runtime is given (a spec string opens one); ValueError if they cannot go together."""
    mode = HostMode(host_mode)
    store = open_store(l3) if isinstance(l3, str) else l3
    if mode is HostMode.BUFFER_ONLY and store is None:
        raise ValueError("host_mode='buffer_only' stages between the device and L3: give an l3 store")
    if store is not None and l2_pages < 1:
        raise ValueError("an l3 store needs l2_pages >= 1: L3 transfers stage through host pages")
    return mode, store


class L3Calls:
    """The L3 part of `LocalGPURuntime`'s facade; it keeps `ledger` and `device_layer`."""

    ledger: Ledger
    device_layer: DeviceLayer

    @operation()
    def l3_exists(self, keys: tuple[str, ...]) -> tuple[bool, ...]:
        """Per key, whether the store holds an object under it now: a hint (a fetch may still miss).
        Blocks on the store's answer (a storage-side query), never on the GPU."""
        keys_argument("l3_exists's keys", keys)
        if self.device_layer.l3 is None:
            raise NoL3("this runtime has no L3 store: give LocalGPURuntime an l3 store")
        return self.device_layer.l3.exists(tuple(keys))

    def stored_objects(self) -> dict[str, tuple[int, ...]] | None:
        """The objects the store holds now under the keys this runtime wrote or read, with their tags
        (decoded from the bytes when the runner is tagged, else the ledger's record); None without L3."""
        layer, known = self.device_layer, self.ledger.state.objects
        if layer.l3 is None:
            return None
        if not layer.runner.tagged:
            present = layer.l3.exists(tuple(known)) if known else ()
            return {key: tags for (key, tags), there in zip(known.items(), present) if there}
        memory = layer.memory
        found = layer.l3.read_objects(list(known), memory.page_bytes)
        objects = {}
        for key, buffer in found.items():
            page = torch.frombuffer(buffer, dtype=torch.uint8).view(memory.l2.dtype).view(1, *memory.page_shape)
            objects[key] = tuple(layer.runner.page_tags(page).flatten().tolist())  # type: ignore[attr-defined]
        return objects
