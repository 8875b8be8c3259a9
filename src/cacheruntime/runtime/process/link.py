"""One end of the socket between control and the runtime process: whole messages, each its length and then its bytes.

Request and reply go in strict turn (the client crosses one call at a time, the runtime
process answers each before it reads the next), so at most one message is ever on its way
and a read that brings more than one is a broken peer, not a case to handle.

Why not `multiprocessing.connection` (the first framing, the same length prefix): its
`recv_bytes` reads the header and the body in two system calls and assembles them in a
`BytesIO`, and its `send_bytes` copies header and body together first, in Python, on every
message, four messages a decode step. Here a message is written with one `sendmsg` of the
two buffers and read with one `recv_into` a buffer kept for the connection, a second read
only for a message longer than it: a quarter less time a round trip between two busy-polling
processes (`benchmarks/diagnostics/processrtt.py`, figures in docs/process-runtime.md).
"""

from __future__ import annotations

import socket
import struct

_LENGTH = struct.Struct("!Q")
#: Messages up to this size (a decode step's, a prefill plan of a few thousand tokens) are read in one call.
BUFFER_BYTES = 1 << 16


class Link:
    """A connected stream socket carrying whole messages; `EOFError` once the other end has closed
    (or `ConnectionResetError`, an `OSError`, when it closed with a message of ours unread)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(True)
        self._sock = sock
        self._buffer = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buffer)

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes) -> None:
        """Write one message."""
        header = _LENGTH.pack(len(data))
        sent = self._sock.sendmsg([header, data])
        if sent < len(header) + len(data):  # a large message the socket's buffer took in part
            self._sock.sendall((header + data)[sent:])

    def recv(self) -> bytes:
        """Read the next message, waiting for it."""
        got = self._read_into(self._view, _LENGTH.size)
        (length,) = _LENGTH.unpack_from(self._buffer)
        end = _LENGTH.size + length
        if end <= len(self._buffer):
            if got < end:
                self._read_into(self._view[got:end], end - got)
            elif got > end:
                raise ConnectionError(f"the peer sent {got - end} bytes beyond a message while one was due")
            return bytes(self._view[_LENGTH.size : end])
        message = bytearray(length)
        body = got - _LENGTH.size
        message[:body] = self._view[_LENGTH.size : got]
        self._read_into(memoryview(message)[body:], length - body)
        return bytes(message)

    def _read_into(self, view: memoryview, at_least: int) -> int:
        """Read into `view` until it holds at least `at_least` bytes (at most all of it); how many it got."""
        got = 0
        while got < at_least:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise EOFError("the other end of the link closed")
            got += n
        return got

    def close(self) -> None:
        self._sock.close()
