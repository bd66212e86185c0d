"""The TensorFlow engine's constrained search: each line's terms as target ids, searched with, and checked.

`TermSearch` gives `engines.tensorflow.Translator` its `terms_batch` (what `TranslatorInterface.translate_terms`
calls). A request with terms runs a search of its own (`decoding`'s strategy with `constraints=` and `banned=`,
`decoding.constraints`), so the unconstrained path, its `tf.function`s and their compiled programs stay exactly
as they are: a request without terms never reaches this module.

A term is tokenized by the target tokenizer alone, as the start of a text. For SentencePiece that is the term
after a space inside a sentence (its pieces start with the word-boundary mark), which is how a whole word
appears in a translation; the output then holds exactly those pieces, so a term glued to the word before it
(no space) does not count (docs/decoding.md, "Terminology").

`TermSearch.translate_constrained` is the same search with the terms given as text and tokenized in the graph
(`tensorflow_graph.encode_terms`), checked there against the limits of `engines.terms`: what a SavedModel serves
as its `translate_constrained` signature.
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
from keras_transformer.engines.tensorflow_chunks import search_in_length_order
from keras_transformer.engines.tensorflow_graph import blank_strings, encode_terms, valid_utf8
from keras_transformer.engines.terms import MAX_BANNED, MAX_CONSTRAINTS, MAX_FORMS, MAX_TERM_TOKENS, TermRequest, shown
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
        the lines in batches of similar length through `terms_batch`, each hypothesis's unmet constraints named
        and its `tokens` counted. A blank line gives `""`, score 0, no tokens, its constraints all unmet."""
        caller = f"{type(self).__name__}.translate_terms"
        if isinstance(lines, (str, bytes)):
            raise TypeError(f"{caller} takes an iterable of lines (a list of str), got one {type(lines).__name__}.")
        texts = [clean_line(line, caller) for line in lines]
        terms = TermRequest.build(len(texts), constraints, banned, glossary, texts)
        if self.options.sampling and terms.positive:  # type: ignore[attr-defined]
            raise ConfigError("Sampling cannot force terms: constraints need strategy 'beam' or 'greedy'; sampling "
                              "honours banned phrases only.")
        texts = self.with_target_lang(texts, target_lang, caller)  # type: ignore[attr-defined]
        prefixes = self.target_prefixes(len(texts), target_prefix, target_lang, caller)  # type: ignore[attr-defined]
        outputs: list[Any] = [
            None if not is_blank(text) else
            [{"translation": "", "score": 0.0, "tokens": 0, "unmet": [shown(term) for term in terms.per_line[i]]}]
            * num_return
            for i, text in enumerate(texts)]
        order = sorted((i for i, text in enumerate(texts) if outputs[i] is None), key=lambda i: len(texts[i].split()))
        for start in range(0, len(order), batch_size):  # batches of similar length: little padding
            chunk = order[start:start + batch_size]
            found = self.terms_batch(
                [texts[i] for i in chunk], TermRequest([terms.per_line[i] for i in chunk], terms.banned), num_return,
                None if prefixes is None else [prefixes[i] for i in chunk])
            for i, hypotheses in zip(chunk, found):
                outputs[i] = [{"translation": text, "score": score, "tokens": tokens,
                               "unmet": [shown(term) for term, ok in zip(terms.per_line[i], met) if not ok]}
                              for text, score, met, tokens in hypotheses]
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

    def _term_graph(self) -> Any:
        """`_term_search` as a `tf.function` (compiled with XLA where the translator is), made once."""
        function = self.__dict__.get("_term_function")
        if function is None:
            function = tf.function(self._term_search, autograph=False, reduce_retracing=True,
                                   jit_compile=True if self.jit_compile else None)  # type: ignore[attr-defined]
            self.__dict__["_term_function"] = function
        return function

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string),
                                                   tf.TensorSpec([None, None], tf.string),
                                                   tf.TensorSpec([None, None], tf.string)])
    def translate_constrained(self, sentences: Any, constraints: Any, banned: Any) -> dict[str, tf.Tensor]:
        """`translate` held to terms given as text: the best translation of each sentence containing its
        constraints and none of its banned phrases, tokenized and checked in the graph.

        Args:
            sentences: `tf.string [N]`.
            constraints: `tf.string [N, C]`: row i, sentence i's constraints, one per slot; a slot's
                alternative forms separated by a tab ("Fahrrad\\tRad"); "" (or blank) is no constraint, so
                rows of different counts fill one rectangle. At most `engines.terms.MAX_CONSTRAINTS` slots,
                `MAX_FORMS` forms a slot and `MAX_TERM_TOKENS` target tokens a form.
            banned: `tf.string [N, B]`: row i, the phrases sentence i's translation may not contain, one per
                slot ("" none); at most `MAX_BANNED` slots.

            Other row counts, a term over a limit, or one holding text the target vocabulary lacks (unk) fail
            with `tf.errors.InvalidArgumentError` naming the problem; so do constraints for a translator that
            samples (it honours banned phrases only).

        Returns:
            `{"translation": tf.string [N], "score": float32 [N], "met": bool [N, C]}`: `translate_terms`' best
            hypotheses (a blank sentence: "", score 0), and per slot whether the translation contains its
            constraint (True for an empty slot; False for a constraint that did not fit the length limit).
        """
        target = self.target_tokenizer  # type: ignore[attr-defined]
        rows = tf.shape(sentences)[0]
        same = [tf.debugging.Assert(tf.equal(tf.shape(values)[0], rows), [
            "translate_constrained: got", rows, "sentence(s) but", tf.shape(values)[0],
            f"row(s) of {name}; give one row per sentence."]) for name, values in (("constraints", constraints),
                                                                                   ("banned", banned))]
        with tf.control_dependencies(same):
            sentences = tf.identity(sentences)
        wanted = encode_terms(target, constraints, "constraints", MAX_CONSTRAINTS, MAX_FORMS, MAX_TERM_TOKENS)
        refused = encode_terms(target, banned, "banned", MAX_BANNED, 1, MAX_TERM_TOKENS)[:, :, 0]  # (N, B, L)
        present = tf.reduce_any(tf.not_equal(wanted, target.pad_id), axis=[2, 3])  # (N, C): slots with a term
        options = self.options.replace(n_best=1)  # type: ignore[attr-defined]
        if options.sampling:
            with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(tf.reduce_any(present)), [
                    "translate_constrained: sampling cannot force terms (constraints need strategy 'beam' or "
                    "'greedy'); it honours banned phrases only: give constraints of \"\" only."])]):
                sentences = tf.identity(sentences)

        def search(source: tf.Tensor, prefix: Any, constraints: tf.Tensor, banned: tf.Tensor) -> Any:
            forced = {"banned": banned} if options.sampling else {"constraints": constraints, "banned": banned}
            return self._term_graph()(source, self.options, 1, forced)  # type: ignore[attr-defined]

        source = self.encode_sources(sentences)  # type: ignore[attr-defined]
        if self.chunk_size:  # type: ignore[attr-defined]
            tokens, scores = search_in_length_order(
                search, source, 1, chunk_size=self.chunk_size,  # type: ignore[attr-defined]
                source_pad_id=self.source_tokenizer.pad_id, target_pad_id=target.pad_id,  # type: ignore[attr-defined]
                max_extra=self.max_extra, max_source_length=self.max_source_length,  # type: ignore[attr-defined]
                max_target_length=self.max_target_length, bucketed=self.jit_compile,  # type: ignore[attr-defined]
                lanes=1, along=(wanted, refused))
        else:
            tokens, scores = search(source, None, wanted, refused)
        met = tf.convert_to_tensor(constraints_met(tokens, wanted, target.pad_id))[:, 0]  # (N, C)
        blank = blank_strings(sentences)  # "" with score 0, its constraints unmet
        translation = valid_utf8(target.detokenize(tokens[:, 0]))
        return {"translation": tf.where(blank, tf.constant(""), translation),
                "score": tf.where(blank, tf.zeros_like(scores[:, 0]), scores[:, 0]),
                "met": tf.where(blank[:, None], tf.logical_not(present), met)}

    def terms_batch(self, texts: list[str], terms: TermRequest, num_return: int,
                    prefixes: list[str] | None = None) -> list[list[tuple[str, float, list[bool], int]]]:
        """Per text (cleaned, not blank), `num_return` `(translation, score, met, tokens)` hypotheses, best first,
        each search held to the text's constraints (`terms.per_line`, one list per text) and banned phrases; `met`
        says, per constraint, whether the hypothesis contains it; `tokens`, the tokens generated (eos counted, as
        the score counts them: `engines.details`)."""
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
        if (self.jit_compile or len(texts) > EAGER_TERM_SENTENCES  # type: ignore[attr-defined]
                or "_term_function" in self.__dict__):  # traced once: every later call runs the graph
            tokens, scores = self._term_graph()(source, options, num_return, forced)
        else:
            tokens, scores = self._term_search(source, options, num_return, forced)
        tokens = np.asarray(tokens)  # (N, R, T)
        met = (np.asarray(constraints_met(tokens, constraints, target.pad_id)) if constraints is not None
               else np.ones(tokens.shape[:2] + (1,), bool))
        flat = valid_utf8(target.detokenize(tf.constant(tokens.reshape(-1, tokens.shape[2]))))
        strings = [text.decode("utf-8") for text in flat.numpy()]
        rows, lengths = tokens.shape[1], (tokens != target.pad_id).sum(axis=2)
        return [[(strings[i * rows + r], float(np.asarray(scores)[i, r]),
                  [bool(flag) for flag in met[i, r, :len(terms.per_line[i])]], int(lengths[i, r]))
                 for r in range(rows)] for i in range(len(texts))]
