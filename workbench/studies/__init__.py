"""A folder of runs as one study: run it, hold its analyses, summarise and report it.

    study.load_study(path) / study.run_study(...)   # a matrix of run configs from one TOML file
    workspace.Workspace(folder)                      # the runs of a folder with their cached analyses:
                                                     # roles, comparisons, noise floors, ladders, costs
    summary.summarise_study(folder)                  # the study's runs, findings and tables in text
    report.write_report(Workspace(folder), path)     # every figure and table in one HTML or PDF file

Everything here reads stores through ``workbench.store`` and analyses them with
``workbench.analysis``; the report draws with ``workbench.figures``. Running a study launches
runs through ``workbench.runner`` (imported only then): importing this package imports no torch.
"""
