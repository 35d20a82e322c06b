"""Tool calls: parsers that find them in a model's text and the outputs their grammars shape."""
