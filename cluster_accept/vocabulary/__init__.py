"""The words every layer shares, below checks/, analysis/ and the rest: the closed status set, the rows, masking of
secrets in node text, and how text is cut. Imports nothing of the package's above it."""
