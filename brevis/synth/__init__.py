"""Choosing programs (compression side only; decoding never imports this)."""
