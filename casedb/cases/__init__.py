"""What a case is: its spec, op names and the op allow-lists, signature, marks, presets, safe literals, valid inputs, blobs, dtypes, and how its inputs are built."""
