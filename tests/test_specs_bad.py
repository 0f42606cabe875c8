"""Bad manifests: every problem reported at once, each with its file, line and field.

The corpus in tests/manifests/bad/ holds one bad manifest per file or small
directory. Each carries the exact lines it must produce as `# expect: ...`
comments (in a directory, in any of its files); the test loads it by its
relative name, as a user would type it, and compares the rendered problems.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specs.loader import load_manifest, load_manifest_files, load_manifest_text
from specs.problems import ManifestError, Problem

BAD = Path(__file__).resolve().parent / "manifests" / "bad"
CASES = sorted(p.name for p in BAD.iterdir() if not p.name.startswith("."))
PREFIX = "# expect: "


def expected_lines(case: Path) -> list[str]:
    files = sorted(case.iterdir()) if case.is_dir() else [case]
    return [
        line.removeprefix(PREFIX)
        for path in files
        for line in path.read_text().splitlines()
        if line.startswith(PREFIX)
    ]


def problems_of(case: str) -> list[Problem]:
    with pytest.raises(ManifestError) as info:
        load_manifest(case)
    return info.value.problems


@pytest.mark.parametrize("case", CASES)
def test_bad_manifest_reports_exactly_its_problems(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = expected_lines(BAD / case)
    assert expected, f"{case} says nothing it expects"
    monkeypatch.chdir(BAD)
    with pytest.raises(ManifestError) as info:
        load_manifest(case)
    rendered = [str(p) for p in info.value.problems]
    assert rendered == expected  # all at once, in file and line order
    assert str(info.value) == "\n".join(expected)
    for problem in info.value.problems:
        assert problem.file and problem.file.startswith(case)
        assert problem.line is not None and problem.line >= 1


def test_the_corpus_covers_the_kinds_of_mistakes() -> None:
    assert len(CASES) >= 24
    text = "\n".join(line for case in CASES for line in expected_lines(BAD / case))
    for needle in [
        "invalid TOML",
        "invalid YAML",
        "unknown field 'ctxx' in models.other; did you mean 'ctx'?",
        "unknown section 'modles'; did you mean 'models'?",
        "expected an integer, got a string '4096'",
        "expected true or false, got an integer 1",
        "expected a string, got a table",
        "missing required field 'source'",
        "invalid model name 'Gemma'",
        "'+' and '#' are reserved",
        "models.gemma declared twice: dup-across-files/a.toml:2 and dup-across-files/b.yaml:4",
        "lora 'fox' names model 'gemm', which is not declared; did you mean 'gemma'?",
        "names engine 'llamacp', which is not declared; did you mean 'llamacpp'?",
        "key 'ci' names model 'qwen3', which is not declared",
        "got 8 characters",
        "got uppercase letters",
        "non-hex characters",
        "sha256 is required for an https:// source",
        "got '5 minutes'",
        "ctx: must be greater than 0",
        "port: must be at most 65535",
        "tls_cert is set without tls_key",
        "unknown source scheme 's3'",
        "pooling applies only with embeddings = true",
        "is already an alias of model 'gemma'",
        "is the name of model 'gemma'",
        "invalid model name '': the name is empty",
        "not a list",
    ]:
        assert needle in text, needle


def test_a_problem_carries_file_line_column_field_message_and_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(BAD)
    (problem,) = problems_of("unknown-field.toml")
    assert problem == Problem(
        message="unknown field 'ctxx' in models.other",
        file="unknown-field.toml",
        line=7,
        column=1,
        path="models.other.ctxx",
        hint="did you mean 'ctx'?",
    )
    (syntax,) = problems_of("toml-syntax.toml")
    assert (syntax.line, syntax.column) == (6, 36)
    first, second = problems_of("duplicate-alias.yaml")
    assert (first.path, first.column) == ("models.qwen.aliases[0]", 15)
    assert (second.path, second.column) == ("models.qwen.aliases[1]", 18)


def test_a_file_that_does_not_parse_hides_no_other_problem_but_invents_none() -> None:
    """References into a file that could not be read are not reported as dangling."""
    with pytest.raises(ManifestError) as info:
        load_manifest_files(
            [
                ("a.toml", '[models.gemma\nsource = "file:///g.gguf"\n'),
                ("b.toml", '[loras.fox]\nmodel = "gemma"\nsource = "file:///f.gguf"\nx = 1\n'),
            ]
        )
    assert [str(p) for p in info.value.problems] == [
        "a.toml:1: invalid TOML: expected ']' at the end of a table declaration",
        "b.toml:4: unknown field 'x' in loras.fox; known fields: model, source, sha256, scale, "
        "always_on, enabled",
    ]


def test_references_are_checked_even_when_fields_are_wrong() -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(
            '[models.gemma]\nsource = "file:///g.gguf"\nctx = "big"\n'
            '[loras.fox]\nmodel = "gemm"\nsource = "file:///f.gguf"\n'
        )
    assert [str(p) for p in info.value.problems] == [
        "blazar.toml:3: models.gemma.ctx: expected an integer, got a string 'big'",
        "blazar.toml:5: lora 'fox' names model 'gemm', which is not declared; "
        "did you mean 'gemma'?",
    ]


def test_duplicate_top_level_keys_across_files() -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest_files([("a.toml", "version = 1\n"), ("b.yaml", "version: 1\nfoo: 2\n")])
    assert [str(p) for p in info.value.problems] == [
        "b.yaml:2: unknown section 'foo'; sections are $schema, version, serving, engines, "
        "engine_routing, models, loras, groups, keys, remotes, mcp, kubernetes"
    ]


@pytest.mark.parametrize(
    ("text", "filename", "line"),
    [
        (
            '[keys.ci]\nsha256 = "' + "0" * 64 + '"\nmodels = ["*", "gemma"]\n',
            "blazar.toml",
            "blazar.toml:3: keys.ci.models: '*' means every model and stands alone; "
            'write ["*"] or list names\n'
            "blazar.toml:3: key 'ci' names model 'gemma', which is not declared; "
            "declare it under [models] first",
        ),
        (
            '[remotes.up]\nurl = "ftp://example.com"\nkey_env = "MY-KEY"\n',
            "blazar.toml",
            "blazar.toml:2: remotes.up.url: expected an http:// or https:// URL, "
            "got 'ftp://example.com'\n"
            "blazar.toml:3: remotes.up.key_env: expected an environment variable name "
            "such as 'OPENAI_API_KEY', got 'MY-KEY'",
        ),
        (
            'engines:\n  e:\n    feed: "http://127.0.0.1:9"\n',
            "blazar.yaml",
            "blazar.yaml:3: engines.e.feed: feed applies only to install = 'release'",
        ),
        (
            "engines:\n  e:\n    source: /src/llama.cpp\n",
            "blazar.yaml",
            "blazar.yaml:3: engines.e.source: source applies only to install = 'source'",
        ),
        (
            "loras:\n  Fox:\n    model: m\n    source: https://example.com/fox.gguf\n"
            "models:\n  m: {source: file:///m.gguf}\n",
            "blazar.yaml",
            "blazar.yaml:2: loras.Fox: invalid LoRA adapter name 'Fox': use lowercase letters, "
            "digits, '.', '-' and '_', starting with a letter or digit; try 'fox'\n"
            "blazar.yaml:2: loras.Fox.sha256: sha256 is required for an https:// source "
            "(the download is verified); add the file's sha256",
        ),
        (
            "version: 1\n---\nversion: 1\n",
            "blazar.yaml",
            "blazar.yaml:2: invalid YAML: expected a single document in the stream, "
            "but found another document",
        ),
        (
            "models:\n  m: {source: file:///m.gguf, aliases: [Big]}\n",
            "blazar.yml",
            "blazar.yml:2: models.m.aliases[0]: invalid model name 'Big': it contains 'B'; "
            "try 'big'; a name is lowercase letters, digits, '.', '-' and '_', starting with "
            "a letter or digit",
        ),
    ],
)
def test_more_bad_values(text: str, filename: str, line: str) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text, filename)
    assert str(info.value) == line


def test_an_unreadable_file_is_reported_with_the_others(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "b.toml").write_text("[serving]\nprot = 1\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    first, second = info.value.problems
    assert first.file == str(tmp_path / "a.toml") and "cannot read the manifest" in first.message
    assert (
        str(second)
        == f"{tmp_path / 'b.toml'}:2: unknown field 'prot' in serving; did you mean 'port'?"
    )
