"""The recorder (torch): per-site statistics and fingerprints from a Megatron Core model.

    from workbench.recorder import record       # around a training loop (creates the store)
    from workbench.recorder import Recorder     # the hooks alone, into a store made elsewhere
    from workbench.recorder import hybrid_local_spec   # a HybridModel without Transformer Engine
"""

from workbench.recorder.hybrid import hybrid_local_spec
from workbench.recorder.recorder import Recorder
from workbench.recorder.session import TrainingRun, record
from workbench.sites import site_matcher

__all__ = ["Recorder", "TrainingRun", "hybrid_local_spec", "record", "site_matcher"]
