from workbench.rank.main import main

main()
