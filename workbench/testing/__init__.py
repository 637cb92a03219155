"""For tests, the project's and a producer's own (needs the ``test`` extra: pytest, hypothesis); the library never
imports it.

    workbench.testing.run_store   RunStoreContract: the tests every producer's run store must pass
    workbench.testing.damage      damage to a store's files and to other programs' files, for fuzzing
"""
