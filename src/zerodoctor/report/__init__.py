"""Render results for people (text, markdown) and machines (versioned JSON). Renderers return strings;
only the CLI writes them."""
