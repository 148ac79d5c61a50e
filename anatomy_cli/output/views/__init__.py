"""One view per result: its columns, its report (heading, sections, notes: what every format prints) and its
picture's caption. ``--format``, ``--plot``, the HTML pages and the API's ``Result`` all read the view."""
