"""The discrete-event simulator: the real routing core on a virtual clock."""

from .metrics import WALL_CLOCK_KEYS, percentile, without_wall_clock
from .network import LatencyModel, parse_latency
from .oracle import OracleIndex, OraclePolicy, OracleView
from .model import SIM_POLICIES, SimConfig
from .simulator import Simulator

__all__ = [
    "SIM_POLICIES",
    "WALL_CLOCK_KEYS",
    "LatencyModel",
    "OracleIndex",
    "OraclePolicy",
    "OracleView",
    "SimConfig",
    "Simulator",
    "parse_latency",
    "percentile",
    "without_wall_clock",
]
