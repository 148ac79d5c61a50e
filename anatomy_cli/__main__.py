from anatomy_cli.cli import main

main()
