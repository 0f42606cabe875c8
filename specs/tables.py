"""What every manifest table shares: strict, frozen, no unknown fields; and the value
types several tables use (cache types, load modes)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

CacheType = Literal["f16", "q8_0", "q4_0"]
LoadMode = Literal["mmap", "none", "mlock", "mmap+mlock"]
FlashAttn = Literal["on", "off", "auto"]


class Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
