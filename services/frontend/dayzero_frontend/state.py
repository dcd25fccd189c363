"""What every request handler of one frontend shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from dayzero_frontend.harmony import HarmonyChat
from dayzero_frontend.metrics import FrontendMetrics
from dayzero_frontend.router_client import RouterClient
from dayzero_frontend.validation import Limits


@dataclass
class FrontendState:
    chat: HarmonyChat
    router: RouterClient
    limits: Limits
    api_key: str | None = None
    metrics: FrontendMetrics = field(default_factory=FrontendMetrics)
