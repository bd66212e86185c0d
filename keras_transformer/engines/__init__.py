"""The engines that translate a trained model, each behind `keras_transformer.engines.interface.TranslatorInterface`.

| engine | module | needs |
| --- | --- | --- |
| TensorFlow (tensorflow-text tokenizers, XLA search, the SavedModel's graph) | `engines.tensorflow` | TensorFlow |
| CTranslate2 (its C++ search over a converted model) | `engines.ctranslate2` | ctranslate2, sentencepiece |
| packed (the model's search in Keras on any backend) | `engines.packed` | Keras, sentencepiece |
| LiteRT (the search converted into `model.tflite`) | `engines.litert` | ai-edge-litert, sentencepiece |

`engines.loader.load_translator` (public as `keras_transformer.load_translator`) picks one for a model folder
and imports that engine only.
"""
