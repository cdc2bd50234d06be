"""The words every layer shares, below checks/, analysis/ and the rest: the closed status set, the rows, masking of
secrets in node text, how text is cut, and how files are written where other users can write too. Imports nothing
of the package's above it."""
