"""The runtime's bookkeeping, without torch: records, the transaction, and the model's sections."""

from cacheruntime.runtime.ledger.choices import FreeOrder, Numbering, Reporting
from cacheruntime.runtime.ledger.ledger import Ledger
from cacheruntime.runtime.ledger.transaction import Transaction

__all__ = ["FreeOrder", "Ledger", "Numbering", "Reporting", "Transaction"]
