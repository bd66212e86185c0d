"""What the package runs beside Keras and TensorFlow rather than on them: the one `Registry` type of the exporters,
engines and strategies (`registry`); hooks on the first import of a module (`import_hooks`), through which Keras'
classes are registered (`registration`) and TensorFlow's C++ log lines kept off stderr (`tensorflow_logs`); and
`keras_internals`, the only module that touches Keras' private code."""
