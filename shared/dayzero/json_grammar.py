"""How a JSON Schema becomes an llguidance grammar: one definition for the frontend (which checks a
request's schema before sending it) and the engine (which masks sampled tokens with it). Imports
neither torch nor a tokenizer, so the slim frontend can use it.

JSON is compiled without flexible whitespace (``", "`` and ``": "`` separators), so a schema whose
values are bounded also bounds the length of the text.
"""

from __future__ import annotations

MAX_SCHEMA_CHARS = 65536
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A schema that cannot be compiled, or structured output unavailable here (a bad request)."""


class GrammarUnavailable(GrammarError):
    """llguidance is not installed in this process."""


def llguidance_module():
    try:
        import llguidance
    except ImportError:
        raise GrammarUnavailable("structured output needs the llguidance package") from None
    return llguidance


def json_grammar(schema_text: str) -> str:
    """The llguidance grammar of a JSON Schema text; GrammarError (with llguidance's reason) if unusable."""
    if len(schema_text) > MAX_SCHEMA_CHARS:
        raise GrammarError(f"schema of {len(schema_text)} characters (at most {MAX_SCHEMA_CHARS})")
    llg = llguidance_module()
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(schema_text, defaults=JSON_OPTIONS)
        failed, errors = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    except (ValueError, TypeError, RuntimeError) as e:
        failed, errors = True, [str(e)]
    if failed:
        raise GrammarError(f"schema could not be compiled: {'; '.join(errors)[:500]}")
    return grammar
