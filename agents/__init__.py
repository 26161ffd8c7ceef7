"""Bundled agent definitions (Markdown with YAML front matter), shipped as package data."""
