"""What Megatron-LM itself writes and runs, in the workbench's terms.

* ``dumps``: its per-tensor dumps (``--save-activations-interval``, ``--save-dgrads-interval``,
  ``--save-wgrads-interval``, ``--save-params-interval``) imported into a run store whose sites line up with a
  recorded run's (``workbench import-megatron-dumps``).

This layer reads torch files, so it imports torch (unlike ``workbench.importers``, which reads logs).
"""
