"""Reading results: report, export, repro scripts, the Datasette server and its plugin."""
