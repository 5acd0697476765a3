"""Pipelines: analyze a checkpoint, count an embeddings file, write a results folder, run the demo.

They sit above the report layer (which only renders tables, figures and LaTeX from results) and
below the CLI: pipelines call the counting engine, the embedder and the report; nothing in
``cocos/report`` imports a pipeline.
"""
