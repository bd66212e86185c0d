"""The TensorFlow engine's constrained search: each line's terms as target ids, searched with, and checked.

`TermSearch` gives `engines.tensorflow.Translator` its `terms_batch` (what `TranslatorInterface.translate_terms`
calls). A request with terms runs a search of its own (`decoding`'s strategy with `constraints=` and `banned=`,
`decoding.constraints`), so the unconstrained path, its `tf.function`s and their compiled programs stay exactly
as they are: a request without terms never reaches this module.

A term is tokenized by the target tokenizer alone, as the start of a text. For SentencePiece that is the term
after a space inside a sentence (its pieces start with the word-boundary mark), which is how a whole word
appears in a translation; the output then holds exactly those pieces, so a term glued to the word before it
(no space) does not count (docs/decoding.md, "Terminology").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.decoding.constraints import constraints_met, pad_constraints
from keras_transformer.decoding.glossary import term_ids
from keras_transformer.engines.lines import Lines, Prefixes, clean_line, is_blank
from keras_transformer.engines.tensorflow_graph import valid_utf8
from keras_transformer.engines.terms import TermRequest, shown
from keras_transformer.errors import ConfigError

# An uncompiled translator runs a constrained search of at most this many sentences eagerly while its graph is not
# traced yet (a trace costs seconds), larger ones, and every one after the first trace, through a `tf.function`
# (`reduce_retracing`: after a second shape of sources or constraints, one trace serves them all).
EAGER_TERM_SENTENCES = 8


class TermSearch:
    """The constrained search of a TensorFlow `Translator` (a mixin: it uses the translator's tokenizers, models,
    options and `encode_sources` / `encode_prefixes`)."""

    def translate_terms(self, lines: Lines, constraints: Sequence[Any] | None = None, banned: Any = None,
                        glossary: Any = None, batch_size: int = 64, target_prefix: Prefixes = None,
                        target_lang: str | None = None, num_return: int = 1) -> list[list[dict[str, Any]]]:
        """`TranslatorInterface.translate_terms`: the terms gathered and checked (`engines.terms.TermRequest`),
        the lines in batches of similar length through `terms_batch`, each hypothesis's unmet constraints named.
        A blank line gives `""`, score 0, its constraints all unmet."""
        caller = f"{type(self).__name__}.translate_terms"
        if isinstance(lines, (str, bytes)):
            raise TypeError(f"{caller} takes an iterable of lines (a list of str), got one {type(lines).__name__}.")
        texts = [clean_line(line, caller) for line in lines]
        terms = TermRequest.build(len(texts), constraints, banned, glossary, texts)
        if self.options.sampling and terms.positive:  # type: ignore[attr-defined]
            raise ConfigError("Sampling cannot force terms: constraints need strategy 'beam' or 'greedy'; sampling "
                              "honours banned phrases only.")
        prefixes = self.target_prefixes(len(texts), target_prefix, target_lang, caller)  # type: ignore[attr-defined]
        outputs: list[Any] = [
            None if not is_blank(text) else
            [{"translation": "", "score": 0.0, "unmet": [shown(term) for term in terms.per_line[i]]}] * num_return
            for i, text in enumerate(texts)]
        order = sorted((i for i, text in enumerate(texts) if outputs[i] is None), key=lambda i: len(texts[i].split()))
        for start in range(0, len(order), batch_size):  # batches of similar length: little padding
            chunk = order[start:start + batch_size]
            found = self.terms_batch(
                [texts[i] for i in chunk], TermRequest([terms.per_line[i] for i in chunk], terms.banned), num_return,
                None if prefixes is None else [prefixes[i] for i in chunk])
            for i, hypotheses in zip(chunk, found):
                outputs[i] = [{"translation": text, "score": score,
                               "unmet": [shown(term) for term, ok in zip(terms.per_line[i], met) if not ok]}
                              for text, score, met in hypotheses]
        return outputs

    def term_tokens(self, text: str) -> list[int]:
        """A term's target ids (`decoding.glossary.term_ids`: the term alone, tokenized); a term whose tokens
        include the unknown token is refused naming it."""
        target = self.target_tokenizer  # type: ignore[attr-defined]
        ids = target.tokenize(tf.constant([text.encode("utf-8")], tf.string))
        row = ids.to_list()[0] if isinstance(ids, tf.RaggedTensor) else ids.numpy().tolist()[0]
        drop = {target.pad_id, target.bos_id, target.eos_id}
        unk_id = getattr(target, "unk_id", None)
        ids = term_ids(text, lambda _: row, unk_id, drop)
        if unk_id in ids:  # forcing it would force unk (as a target prefix holding it is refused)
            raise ConfigError(f"The term {text!r} holds text the target vocabulary does not have (token "
                              f"{ids.index(unk_id) + 1} of {len(ids)} is unk).")
        return ids

    def _term_search(self, source: Any, options: Any, num_return: int, forced: dict[str, Any]) -> tuple[Any, Any]:
        """The search with `forced` terms. `options` is the translator's own object, `n_best` set in here: a
        `tf.function` keys a Python argument by a weak reference, so a fresh copy per call would trace anew."""
        target = self.target_tokenizer  # type: ignore[attr-defined]
        return decoding.strategy(options.strategy)(
            self.models, source, options.replace(n_best=num_return),  # type: ignore[attr-defined]
            pad_id=target.pad_id,
            bos_id=target.bos_id, eos_id=target.eos_id, first_cache_stage=decoding.FIRST_CACHE_STAGE, **forced)

    def terms_batch(self, texts: list[str], terms: TermRequest, num_return: int,
                    prefixes: list[str] | None = None) -> list[list[tuple[str, float, list[bool]]]]:
        """Per text (cleaned, not blank), `num_return` `(translation, score, met)` hypotheses, best first, each
        search held to the text's constraints (`terms.per_line`, one list per text) and banned phrases; `met`
        says, per constraint, whether the hypothesis contains it."""
        target = self.target_tokenizer  # type: ignore[attr-defined]
        per_line, banned = terms.ids(self.term_tokens)
        forced: dict[str, Any] = {}
        constraints = None
        if any(per_line):
            constraints = pad_constraints(per_line, target.pad_id, forms=True)
            forced["constraints"] = tf.constant(constraints)
        if banned:
            forced["banned"] = tf.constant(pad_constraints([banned] * len(texts), target.pad_id))
        if prefixes is not None:
            self.target_prefix_ids(prefixes)  # type: ignore[attr-defined]  # a bad prefix named before the search
            forced["target_prefix"] = self.encode_prefixes(  # type: ignore[attr-defined]
                tf.constant([text.encode("utf-8") for text in prefixes], tf.string))
        source = self.encode_sources(tf.constant([text.encode("utf-8") for text in texts], tf.string))  # type: ignore[attr-defined]
        options = self.options  # type: ignore[attr-defined]
        function = self.__dict__.get("_term_function")
        if self.jit_compile or len(texts) > EAGER_TERM_SENTENCES or function is not None:  # type: ignore[attr-defined]
            if function is None:
                function = tf.function(self._term_search, autograph=False, reduce_retracing=True,
                                       jit_compile=True if self.jit_compile else None)  # type: ignore[attr-defined]
                self.__dict__["_term_function"] = function
            tokens, scores = function(source, options, num_return, forced)
        else:
            tokens, scores = self._term_search(source, options, num_return, forced)
        tokens = np.asarray(tokens)  # (N, R, T)
        met = (np.asarray(constraints_met(tokens, constraints, target.pad_id)) if constraints is not None
               else np.ones(tokens.shape[:2] + (1,), bool))
        flat = valid_utf8(target.detokenize(tf.constant(tokens.reshape(-1, tokens.shape[2]))))
        strings = [text.decode("utf-8") for text in flat.numpy()]
        rows = tokens.shape[1]
        return [[(strings[i * rows + r], float(np.asarray(scores)[i, r]),
                  [bool(flag) for flag in met[i, r, :len(terms.per_line[i])]]) for r in range(rows)]
                for i in range(len(texts))]
