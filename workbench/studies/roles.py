"""The roles of a folder's runs, from their manifests alone, whoever produced the runs (never from their names).

* the *reference* is preferably deterministic, fp32, on one process and repeated (in that order of
  preference; ties by name);
* *repeats* are runs of one configuration (``repeat_key``);
* the *noise floor* runs are the largest group of nondeterministic repeats (with every nondeterminism source
  off, where there are such repeats), plus the reference when it differs from them only in determinism;
* the *seed runs* are runs of one configuration with two or more seeds (the reference's, where it has other
  seeds), the second scale a difference is judged against;
* the *source runs* are the other nondeterministic runs of the reference's configuration, by the sources they
  had on (an attribution study);
* the *band runs* carry one rounding's noise (``RunManifest.perturbation``): the band a change is judged against;
* the *others* are what is left: precision and layout changes.

    roles = find_roles({name: run.manifest for name, run in runs.items()}, recorded)
    roles.reference, roles.floor_runs, roles.repeat_of("det-r1")
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase as fnmatch

from workbench.analysis.sources import source_label
from workbench.config import RunConfig
from workbench.determinism import sources_on
from workbench.environment import BITWISE_FACTS
from workbench.errors import WorkbenchError
from workbench.store.manifest import RUNNER, RunManifest


def repeat_key(info: RunManifest, *, seed: bool = True) -> tuple[object, ...] | None:
    """What two repeats of one configuration share; None for a run that repeats nothing (resumed, faulted,
    replayed, or imported without a model signature and seed). Without ``seed``: what runs that differ only in
    their seed share.

    The runner's runs: the hash of their numerics config (everything but the name). Any other producer: model
    signature, layout, precision, determinism, seed and (where recorded) the nondeterminism sources that were on.
    Either way, the code (``code_key``): a loop's own configuration and the revision. A band run
    (``perturbation``) repeats nothing: it is the rounding its reference allows.
    Either way, the recorded facts of the environment that split a reduction differently
    (``environment.BITWISE_FACTS``: vector ISA, threads, device): one process with 2 threads and two ranks with
    1 each differ at step 0, so they are not repeats of each other.
    """
    if info.resumes or info.fault is not None or info.replay is not None or info.perturbation is not None:
        return None
    machine = tuple((k, info.runtime[k]) for k in BITWISE_FACTS if k in info.runtime)
    code = code_key(info)
    if info.producer == RUNNER and info.config_hash is not None:
        if seed:
            return ("config", info.config_hash, *code, *machine)
        try:
            return ("config", RunConfig.from_dict(info.config or {}).numerics_hash(seed=False), *code, *machine)
        except WorkbenchError:  # a config this version cannot read: it is nobody's other seed
            return None
    if info.model is None or info.seed is None or info.deterministic is None:
        return None
    sources = sources_on(info.determinism) if info.determinism.get("sources") else None
    return (tuple(info.model.shape().items()), info.layout.summary(), info.precision, info.deterministic,
            *([info.seed] if seed else []), *([tuple(sorted(sources))] if sources is not None else []), *code,
            *machine)


NOT_CODE = ("run_dir", "name", "seed", "perturb", "emulate", "save*", "load*", "*_dir", "*_path", "*_interval",
            "eval_*", "log_*", "wandb_*", "tensorboard_*", "timing_*", "exit_*")
"""Patterns of ``user_config`` keys that say where a run writes, what it is called, how often it logs, saves or
evaluates (Megatron-LM's ``save``, ``tensorboard_dir``, ``log_interval``, ``eval_iters`` ...), not what its
training computes: two repeats of one loop may differ in them. And those the manifest holds in fields of its
own: the seed, and the workbench's switches a loop passes on (``record(..., perturb=, emulate=)``)."""


def code_key(info: RunManifest) -> tuple[object, ...]:
    """What says which code made a run, where recorded: its ``user_config`` less what does not shape its numbers
    (``NOT_CODE``, and any value that is a path), and the revision of the code. Runs that differ in either are
    never repeats of one another."""
    key: list[object] = []
    if info.user_config is not None:
        numerics = {k: v for k, v in info.user_config.items() if not any(fnmatch(k, p) for p in NOT_CODE)
                    and not (isinstance(v, str) and ("/" in v or "\\" in v))}
        key.append(("user_config", json.dumps(numerics, sort_keys=True, default=str)))
    if info.revision is not None:
        key.append(("revision", info.revision))
    return tuple(key)


def sources_of(info: RunManifest) -> list[str] | None:
    """The nondeterminism sources that were on in a run (``workbench.determinism.sources_on``)."""
    return sources_on(info.determinism or {"deterministic": info.deterministic})


@dataclass(frozen=True)
class Roles:
    """What each run of a folder is for (``find_roles``); every list is in name order unless it says otherwise."""

    reference: str
    repeat_groups: list[list[str]]
    """Recorded runs of one configuration, two or more per group."""
    floor_runs: list[str]
    """The noise floor's runs (two or more, or none); the reference first where it belongs."""
    seed_runs: list[str]
    source_runs: dict[str, str]
    """Run -> the sources it had on (``a+b``)."""
    all_off_runs: list[str]
    """Runs of the reference's configuration with every source off (deterministic ones included)."""
    resumed: list[str]
    faulted: list[str]
    """Runs with an injected fault (config ``fault``): anomaly, replay and bisect material."""
    band_runs: list[str]
    """Runs with rounding noise added (``record(..., perturb=...)``): the band of the run they perturb."""
    others: list[str]
    """Recorded runs that are none of the above: precision and layout changes."""
    precision_runs: list[str]
    """Others computing in another precision than the reference."""
    layout_runs: list[str]
    """Others with another TP / PP / DP layout than the reference."""
    nondeterministic_repeats: list[str]
    """The noise floor's nondeterministic runs (two or more, or none)."""
    recorded: list[str]

    @property
    def repeats(self) -> set[str]:
        """Runs that repeat an earlier run of their group (the group's first is not among them)."""
        return {name for group in self.repeat_groups for name in group[1:]}

    def repeat_of(self, name: str) -> str | None:
        """Another run of ``name``'s repeat group, or None."""
        group = next((g for g in self.repeat_groups if name in g), [])
        return next((n for n in group if n != name), None)

    def divergence_pair(self) -> tuple[str, str] | None:
        """Two runs worth exploring: two nondeterministic repeats; else the reference and its repeat, or the first
        other recorded run; None with fewer than two recorded runs."""
        if len(self.nondeterministic_repeats) >= 2:
            return self.nondeterministic_repeats[0], self.nondeterministic_repeats[1]
        other = self.repeat_of(self.reference) or next((n for n in self.recorded if n != self.reference), None)
        return (self.reference, other) if other else None


def find_roles(infos: Mapping[str, RunManifest], recorded: Iterable[str]) -> Roles:
    """The roles of the runs ``infos`` (name -> typed manifest), of which ``recorded`` have per-site records."""
    with_records = set(recorded)
    recorded = [n for n in infos if n in with_records]
    faulted = [n for n, info in infos.items() if info.fault is not None]
    band = [n for n in recorded if infos[n].perturbation is not None]
    resumed = [n for n in recorded if infos[n].resumes]
    groups = _repeat_groups(infos, recorded)
    reference = _reference(infos, recorded, faulted, groups)
    floor = _floor_runs(infos, recorded, reference, groups)
    seeds = _seed_runs(infos, reference)
    configuration = (infos[reference].configuration(), code_key(infos[reference]))

    def same_configuration(info: RunManifest) -> bool:
        return (info.configuration(), code_key(info)) == configuration

    all_off = [n for n, info in infos.items() if n not in faulted and not info.resumes and info.perturbation is None
               and same_configuration(info) and sources_of(info) == []]
    sources = {n: source_label(on) for n in recorded if (on := sources_of(infos[n]))
               and infos[n].deterministic is False and n not in floor and n != reference
               and same_configuration(infos[n]) and repeat_key(infos[n]) is not None} \
        if reference in recorded else {}
    repeats = {name for group in groups for name in group[1:]}
    others = [n for n in recorded if n != reference and n not in floor and n not in repeats and n not in resumed
              and n not in faulted and n not in seeds and n not in sources and n not in all_off and n not in band]
    ref = infos[reference]
    return Roles(reference=reference, repeat_groups=groups, floor_runs=floor, seed_runs=seeds, source_runs=sources,
                 all_off_runs=all_off, resumed=resumed, faulted=faulted, band_runs=band, others=others,
                 precision_runs=[n for n in others if infos[n].precision != ref.precision],
                 layout_runs=[n for n in others if infos[n].layout != ref.layout],
                 nondeterministic_repeats=[n for n in floor if infos[n].deterministic is False], recorded=recorded)


def _repeat_groups(infos: Mapping[str, RunManifest], recorded: list[str]) -> list[list[str]]:
    groups: dict[tuple[object, ...], list[str]] = {}
    for name in sorted(recorded):
        key = repeat_key(infos[name])
        if key is not None:
            groups.setdefault(key, []).append(name)
    return [group for group in groups.values() if len(group) > 1]


def _reference(infos: Mapping[str, RunManifest], recorded: list[str], faulted: list[str],
               groups: list[list[str]]) -> str:
    candidates = [n for n in recorded if not infos[n].resumes and n not in faulted and infos[n].perturbation is None]
    repeated = {n for group in groups for n in group}

    def preference(name: str) -> tuple[bool, bool, bool, bool, str]:
        # deterministic, fp32, one process, with a repeat that shows it reproducible; then by name
        info = infos[name]
        return (info.deterministic is not True, info.precision != "fp32", info.layout.world_size != 1,
                name not in repeated, name)

    return min(candidates or recorded or list(infos), key=preference)


def _floor_runs(infos: Mapping[str, RunManifest], recorded: list[str], reference: str,
                groups: list[list[str]]) -> list[str]:
    nondeterministic = [g for g in groups if infos[g[0]].deterministic is False]
    all_off = [g for g in nondeterministic if sources_of(infos[g[0]]) == []]  # an attribution study's floor
    runs = max(all_off or nondeterministic, key=len, default=[])
    if runs and reference in recorded and reference not in runs and \
            (infos[reference].configuration(), code_key(infos[reference])) == \
            (infos[runs[0]].configuration(), code_key(infos[runs[0]])):
        runs = [reference, *runs]
    return runs if len(runs) >= 2 else []


def _seed_runs(infos: Mapping[str, RunManifest], reference: str) -> list[str]:
    """The reference's configuration if it has other seeds, else the largest such group; empty if none."""
    groups: dict[tuple[object, ...], list[str]] = {}
    for name in sorted(infos):
        key = repeat_key(infos[name], seed=False)
        if key is not None:
            groups.setdefault(key, []).append(name)
    seeded = [g for g in groups.values() if len({infos[n].seed for n in g}) >= 2]
    with_reference = [g for g in seeded if reference in g]
    return (with_reference or sorted(seeded, key=len, reverse=True) or [[]])[0]
