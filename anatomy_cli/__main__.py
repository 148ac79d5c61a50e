from anatomy_cli.cli.entry import main

main()
