"""Conformance of every registered study to the interface (xling/studies/base.py).

Each study instantiates (every abstract step of it and of its capabilities is there), its
options dump to a JSON schema with a description per key, its parsers resolve by name, and
its prompt files load. Each config that names a study plans prompt sets whose parsers exist.
"""

from __future__ import annotations

import inspect
import json
import os

import pytest
import yaml
from pydantic import ValidationError

from golden_plan import ROOT, _local
from xling.studies import base
from xling.studies.registry import NAMES, STUDIES, find_parser, get_study

CAPABILITIES = (base.Generative, base.Translated, base.Narrowed, base.Judged, base.PairJudged,
                base.Featured, base.Ranked, base.Cited)


@pytest.mark.parametrize("name", NAMES)
def test_study_implements_the_interface(name):
    study = get_study(name)
    assert isinstance(study, base.Study) and study.name == name
    assert not inspect.isabstract(type(study))
    for cap in CAPABILITIES:  # a declared capability is implemented, not inherited abstract
        if isinstance(study, cap):
            for method in cap.__abstractmethods__:
                assert getattr(type(study), method) is not getattr(cap, method), (name, method)
    assert get_study(name) is study  # one instance per process
    # a study is either generative or ranked, and a ranked one stubs no generative step
    assert isinstance(study, base.Generative) != isinstance(study, base.Ranked), name
    if isinstance(study, base.Ranked):
        assert not hasattr(study, "build_prompts") and not hasattr(study, "score"), name


@pytest.mark.parametrize("name", NAMES)
def test_options_are_a_documented_json_schema(name):
    options = get_study(name).Options
    assert issubclass(options, base.StudyOptions)
    schema = options.model_json_schema()
    assert schema["type"] == "object" and schema["properties"]
    assert options.model_config.get("extra") == "forbid"
    undocumented = [k for k, v in schema["properties"].items() if not v.get("description")]
    assert undocumented == [], f"{name}: options without a description: {undocumented}"


@pytest.mark.parametrize("name", NAMES)
def test_parsers_resolve_and_prompt_files_load(name):
    study = get_study(name)
    for parser, fn in (study.parsers() if isinstance(study, base.Generative) else {}).items():
        assert find_parser(parser) is fn
        parsed, error = fn("")  # an empty output is an error row, never an exception
        assert parsed is None or isinstance(parsed, dict)
    for path in study.prompt_files():
        assert path.is_file(), path
    study.load_prompt_files()


def test_an_unknown_parser_lists_the_known_ones():
    with pytest.raises(KeyError, match="known: .*answer_tag"):
        find_parser("no-such-parser")


def _study_configs():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name.endswith(".expected.yaml"):
            continue
        data = yaml.safe_load(path.read_text())
        if (data.get("study") or {}).get("task"):
            yield path


@pytest.mark.parametrize("path", list(_study_configs()), ids=lambda p: p.name)
def test_each_configs_prompt_sets_name_known_parsers(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    data = _local(yaml.safe_load(path.read_text()))
    if path.name == "mirage.yaml":
        data["study"]["options"]["langs"] = ["en", "sw"]  # the fixture's languages
    study = get_study(data["study"]["task"])
    opts = study.validate_options(data["study"].get("options"))
    if isinstance(study, base.Ranked):  # scored by the evaluate stage's IR cells
        return
    sets = study.prompt_sets(opts)
    assert sets and all(isinstance(s, base.PromptSet) for s in sets)
    for s in sets:
        find_parser(study.parser_for(s.setting))
    if isinstance(study, (base.Judged, base.PairJudged)):
        find_parser(study.judge_parser(opts))


@pytest.mark.parametrize("path", list(_study_configs()), ids=lambda p: p.name)
def test_options_are_frozen_and_read_back_from_cell_params(path, monkeypatch):
    """Study steps read the validated Options object; cell params carry (and hash) its
    `as_options` dict, which `options_of` reads back to an equal object."""
    monkeypatch.chdir(ROOT)
    data = _local(yaml.safe_load(path.read_text()))
    if path.name == "mirage.yaml":
        data["study"]["options"]["langs"] = ["en", "sw"]
    study = get_study(data["study"]["task"])
    opts = study.validate_options(data["study"].get("options"))
    assert type(opts) is study.Options
    field = next(iter(study.Options.model_fields))
    with pytest.raises(ValidationError, match="frozen"):
        setattr(opts, field, getattr(opts, field))
    params = {"options": opts.as_options()}
    assert json.loads(json.dumps(params)) == params  # plain JSON, as the cell hash reads it
    back = study.options_of(params)
    assert back == opts and back.as_options() == params["options"]
    assert study.options_of({"options": dict(reversed(params["options"].items()))}) is back


def test_the_config_dumps_the_options_dict():
    """`study.options` of a loaded config is the Options object; the config dumps (and
    hashes) it as the dict the cells carry."""
    from xling.config import validate_config

    cfg = validate_config({"name": "x", "study": {"task": "cross", "options": {
        "data": [os.path.join(ROOT, "tests/data/mlongrr/1-needle/English_needles.csv")],
        "query_langs": ["en"], "methods": ["baseline"]}}})
    opts = cfg.study.options
    assert isinstance(opts, get_study("cross").Options) and opts.query_langs == ["en"]
    assert cfg.model_dump(mode="json")["study"]["options"] == opts.as_options()


def test_unknown_option_is_refused_with_the_key_named(tmp_path):
    from xling.config import ConfigError, validate_config

    with pytest.raises(ConfigError, match=r"study\.options\.no_such_key: unknown key"):
        validate_config({"name": "x", "study": {"task": "cross", "options": {
            "data": [os.path.join(ROOT, "tests/data/mlongrr/1-needle/English_needles.csv")],
            "no_such_key": 1}}})


def test_registry_names_its_modules():
    assert set(STUDIES) == set(NAMES)
    for where in STUDIES.values():
        module, _, cls = where.partition(":")
        assert module.startswith("xling.studies.") and cls
