"""Wrong tokens by client address (``GuessLimiter``): one per server process, shared by every
door that checks the server's token (``memworker serve``: the API's ``Guard`` and the
inspector's sign-in form and bearer header; ``memworker mcp --http``: its ``Guard``).

After ``GUESS_FAILURES`` wrong tokens from one address within ``GUESS_WINDOW_SECONDS``, a wrong
token from it is answered 429 with ``Retry-After`` (the seconds until the oldest failure leaves
the window) instead of 401, and is not counted. Only wrong tokens count: a request without
credentials is no guess, and a correct token is never counted nor refused, at every door (the
inspector's sign-in form included: a guesser behind an address it shares with others, a NAT
or a proxy, locks no one out). The count is kept in the process (addresses and times only, at most
``GUESS_ADDRESSES`` addresses, the least recently failed dropped first); behind a proxy every
client shares the proxy's address unless the proxy says who the client is
(``X-Forwarded-For``, which uvicorn takes from 127.0.0.1 only)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

GUESS_FAILURES = 10
"""Wrong tokens a client address may send within the window before it must wait."""
GUESS_WINDOW_SECONDS = 60.0
GUESS_ADDRESSES = 10_000
"""Addresses followed at once (the least recently failed is dropped first)."""


class GuessLimiter:
    """Failed token checks by client address, in a sliding window (module doc)."""

    def __init__(
        self,
        failures: int = GUESS_FAILURES,
        window: float = GUESS_WINDOW_SECONDS,
        addresses: int = GUESS_ADDRESSES,
    ) -> None:
        self.failures, self.window, self.addresses = failures, window, addresses
        self.seen: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, address: str, now: float | None = None) -> float:
        """Seconds ``address`` must wait before it may try again (0: it may now)."""
        at = time.monotonic() if now is None else now
        times = self.seen.get(address)
        if times is None:
            return 0.0
        while times and times[0] <= at - self.window:
            times.popleft()
        if not times:
            del self.seen[address]
            return 0.0
        return max(0.0, times[0] + self.window - at) if len(times) >= self.failures else 0.0

    def failed(self, address: str, now: float | None = None) -> None:
        """Count a wrong token from ``address``."""
        times = self.seen.setdefault(address, deque(maxlen=self.failures))
        times.append(time.monotonic() if now is None else now)
        self.seen.move_to_end(address)
        while len(self.seen) > self.addresses:
            self.seen.popitem(last=False)

    def refuse(self, address: str) -> int:
        """A wrong token from ``address`` was sent: the whole seconds of its ``Retry-After``
        when it must wait (the guess not counted), or 0 (counted: answer it 401)."""
        wait = self.wait(address)
        if wait > 0:
            return max(1, math.ceil(wait))
        self.failed(address)
        return 0

    def line(self, seconds: int) -> str:
        """The one line a refused guess is answered with."""
        return (
            f"too many wrong tokens from your address ({self.failures} within "
            f"{self.window:g} s): try again in {seconds} s"
        )


def client_address(scope: Mapping[str, Any]) -> str:
    """The client's address in an ASGI scope (``''`` when the server does not know it)."""
    client = scope.get("client")
    return str(client[0]) if client else ""
