"""The runtime's device layer: KV memory, ReqToToken, streams, ordering points, the D2H throttle, runners."""

from cacheruntime.runtime.device.layer import DeviceLayer, Launched
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.device.runner import Runner

__all__ = ["DeviceLayer", "Launched", "Ordering", "Runner"]
