"""From an anomaly to the operation that made it: the steps that rerun training to explain a run.

    replay.replay(run, step)                 # the run again from its checkpoint through ``step``,
                                             # every site recorded (``RUN/replays/step_K``)
    bisect.bisect(a, b)                      # step -> site -> operation, from two traced replays
    investigation.investigate(run, ...)      # the first anomaly, replayed and bisected
    watch.watch_anomalies(run, on_new=...)   # anomalies of a run while it trains

Replays and bisection launch real runs through ``workbench.runner`` (in other processes); the
analysis they report is ``workbench.analysis``'s. Importing this package imports no torch.
"""
