"""Maintainer tools: the quilt workflow, rebase onto a new tag, upstream export."""
