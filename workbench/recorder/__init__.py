"""The recorder (torch): per-site statistics and fingerprints from a Megatron Core model.

    from workbench.recorder import Recorder
"""

from workbench.recorder.recorder import Recorder, site_matcher

__all__ = ["Recorder", "site_matcher"]
