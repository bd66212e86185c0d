"""Documents, not lines: plain text, HTML and XML translated sentence by sentence with their layout kept.

- `segmentation`: a document as a skeleton (what stays) and its sentences (what is translated), and back.
- `cutting`: a sentence over the model's token budget cut at clause boundaries, then at words.
- `markup`: HTML and XML through lxml; inline tags placed back by word alignment.
- `alignment`: word alignments, proportional or from the model's cross-attention.
- `document`: `translate_document`, which every translator offers as a method
  (`keras_transformer.engines.interface.TranslatorInterface.translate_document`), and its two steps:
  `plan_document` (read, segmented, cut: once) and `translate_plan`.

Standard library, numpy, lxml and sentencex only (docs/documents.md).
"""

from keras_transformer.documents.alignment import (
    alignment_from_attention,
    attention_aligner,
    proportional_alignment,
)
from keras_transformer.documents.cutting import cut
from keras_transformer.documents.document import (
    MAX_DOCUMENT_BYTES,
    DocumentPlan,
    plan_document,
    read_document,
    translate_document,
    translate_plan,
)
from keras_transformer.documents.segmentation import Segmented, reassemble, segment

__all__ = ["MAX_DOCUMENT_BYTES", "DocumentPlan", "Segmented", "alignment_from_attention", "attention_aligner", "cut",
           "plan_document", "proportional_alignment", "read_document", "reassemble", "segment", "translate_document",
           "translate_plan"]
