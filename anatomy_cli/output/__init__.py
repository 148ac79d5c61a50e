"""What the user sees: render (table/json/jsonl/csv/tsv), tables (rich layouts), plots (--plot FILE).

Used by cli only; may import analyses' result types, engine constants, text, models, errors and units.
"""
