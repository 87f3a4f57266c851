from casedb.cli import main

main()
