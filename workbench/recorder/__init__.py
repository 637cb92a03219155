"""The recorder (torch): per-site statistics and fingerprints from a Megatron Core model.

    from workbench.recorder import record       # around a training loop (creates the store)
    from workbench.recorder import Recorder     # the hooks alone, into a store made elsewhere
"""

from workbench.recorder.recorder import Recorder
from workbench.recorder.session import TrainingRun, record
from workbench.sites import site_matcher

__all__ = ["Recorder", "TrainingRun", "record", "site_matcher"]
