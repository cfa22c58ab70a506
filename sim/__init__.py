"""vLLM-compatible model-server simulator.

One process can serve many simulated servers ("a fleet"), each with its own engine state:
continuous batching, a block KV cache with prefix reuse, LoRA slots, vLLM/SGLang/TRT-LLM metric
names and fault injection. Start one in-process with :func:`sim.fleet.start_fleet` or from the
command line with ``vllm-sim``.
"""

from sim.config import Faults, ServerConfig
from sim.fleet import Fleet, start_fleet
from sim.profiles import PROFILES, Profile

__all__ = ["PROFILES", "Faults", "Fleet", "Profile", "ServerConfig", "start_fleet"]
